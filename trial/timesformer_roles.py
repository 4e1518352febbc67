"""TimeSformer (tiny) planned under forced roles."""
import torch
import parallelizer

def build(B=2, frames=2):
    from transformers import TimesformerConfig, TimesformerForVideoClassification
    torch.manual_seed(0)
    cfg = TimesformerConfig(image_size=32, patch_size=8, num_frames=frames, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=64, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0, num_labels=5)
    m = TimesformerForVideoClassification(cfg)
    return m, (torch.randn(B, frames, 3, 32, 32),)

if __name__ == "__main__":
    import sys
    m, inp = build(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
    tr = parallelizer.trace(m, inp)
    for mesh, roles in [({"dp": 2}, {"dp": "ddp"}), ({"dp": 2}, {"dp": "fsdp"}), ({"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"})]:
        try:
            p = parallelizer.plan(tr, mesh, axis_roles=roles)
            print(mesh, roles, "OK")
        except Exception as e:
            print(mesh, roles, type(e).__name__, str(e)[:1500])
