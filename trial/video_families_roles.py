"""ViViT and VideoMAE (tiny, transformers) under forced ddp / fsdp on dp=2: plan, then rehearse (2 steps)."""
import contextlib, io
import torch
import parallelizer
from parallelizer.runtime.rehearsal import rehearse_many

def vivit():
    from transformers import VivitConfig, VivitForVideoClassification
    torch.manual_seed(0)
    cfg = VivitConfig(image_size=16, num_frames=4, tubelet_size=[2, 8, 8], hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=64, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, num_labels=5)
    return VivitForVideoClassification(cfg), (torch.randn(2, 4, 3, 16, 16),)

def videomae():
    from transformers import VideoMAEConfig, VideoMAEForVideoClassification
    torch.manual_seed(0)
    cfg = VideoMAEConfig(image_size=16, patch_size=8, num_frames=4, tubelet_size=2, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=64, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0, num_labels=5)
    return VideoMAEForVideoClassification(cfg), (torch.randn(2, 4, 3, 16, 16),)

if __name__ == "__main__":
    cases = []
    for fn in (vivit, videomae):
        m, inp = fn()
        with contextlib.redirect_stdout(io.StringIO()):
            tr = parallelizer.trace(m, inp)
        for roles in ({"dp": "ddp"}, {"dp": "fsdp"}):
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    cases.append((f"{fn.__name__} {roles}", fn, parallelizer.plan(tr, {"dp": 2}, axis_roles=roles)))
                print(fn.__name__, roles, "planned", flush=True)
            except Exception as e:
                print(fn.__name__, roles, type(e).__name__, str(e)[:300], flush=True)
    for (tag, _, _), r in zip(cases, rehearse_many([(fn, {}, p) for _, fn, p in cases], steps=2)):
        print("REHEARSE", tag, "ratio=%.3g" % r.tolerance_ratio, r.collectives)
