"""DEFAULT configs (only layer counts set to 2), traced on meta, planned on h100:1x8 dp=2 x tp=4."""
import sys, time, warnings, contextlib, io
import torch, transformers as T, parallelizer
from parallelizer.errors import ParallelizerError

Bt, St = 8, 512


def ids():
    return torch.zeros(Bt, St, dtype=torch.long, device="meta")


def img(n):
    return torch.zeros(Bt, 3, n, n, device="meta")


CASES = {
    "megatron_bert": (T.MegatronBertConfig, T.MegatronBertForMaskedLM, dict(num_hidden_layers=2), lambda c: ((ids(),), {"labels": ids()})),
    "data2vec_text": (T.Data2VecTextConfig, T.Data2VecTextForMaskedLM, dict(num_hidden_layers=2), lambda c: ((ids(),), {"labels": ids()})),
    "splinter": (T.SplinterConfig, T.SplinterForQuestionAnswering, dict(num_hidden_layers=2), lambda c: ((ids(),), {})),
    "tapas": (T.TapasConfig, T.TapasForMaskedLM, dict(num_hidden_layers=2), lambda c: ((ids(),), {"token_type_ids": torch.zeros(Bt, St, 7, dtype=torch.long, device="meta"), "labels": ids()})),
    "lilt": (T.LiltConfig, T.LiltForSequenceClassification, dict(num_hidden_layers=2), lambda c: ((ids(),), {"bbox": torch.zeros(Bt, St, 4, dtype=torch.long, device="meta")})),
    "markuplm": (T.MarkupLMConfig, T.MarkupLMForQuestionAnswering, dict(num_hidden_layers=2), lambda c: ((ids(),), {"xpath_tags_seq": torch.zeros(Bt, St, 50, dtype=torch.long, device="meta"), "xpath_subs_seq": torch.zeros(Bt, St, 50, dtype=torch.long, device="meta")})),
    "yolos": (T.YolosConfig, T.YolosForObjectDetection, dict(num_hidden_layers=2), lambda c: ((torch.zeros(Bt, 3, 512, 864, device="meta"),), {})),
    "vitmae": (T.ViTMAEConfig, T.ViTMAEForPreTraining, dict(num_hidden_layers=2, decoder_num_hidden_layers=2), lambda c: ((img(224),), {})),
    "fuyu": (T.FuyuConfig, T.FuyuForCausalLM, dict(num_hidden_layers=2), lambda c: ((ids(),), {"labels": ids()})),
    "emu3": (T.Emu3TextConfig, T.Emu3ForCausalLM, dict(num_hidden_layers=2), lambda c: ((ids(),), {"labels": ids()})),
    "git": (T.GitConfig, T.GitForCausalLM, dict(num_hidden_layers=2, vision_config=dict(num_hidden_layers=2)), lambda c: ((ids(),), {"pixel_values": img(224), "labels": ids()})),
    "depth_anything": (T.DepthAnythingConfig, T.DepthAnythingForDepthEstimation, dict(backbone_config=dict(model_type="dinov2", num_hidden_layers=2, out_indices=[1, 2], reshape_hidden_states=False, image_size=518, patch_size=14), reassemble_factors=[4, 2], neck_hidden_sizes=[96, 192]), lambda c: ((img(518),), {})),
}

if __name__ == "__main__":
    for name in sys.argv[1:] or CASES:
        cfg_cls, cls, over, inp = CASES[name]
        try:
            cfg = cfg_cls(**over)
            with torch.device("meta"):
                m = cls(cfg).train()
            a, k = inp(cfg)
            t = time.perf_counter()
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                tr = parallelizer.trace(m, a, k)
            tt = time.perf_counter() - t
            t = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                plan = parallelizer.plan(tr, {"dp": 2, "tp": 4}, cluster="h100:1x8")
            pt = time.perf_counter() - t
            ws = [str(x.message)[:150] for x in w if "differs" in str(x.message)]
            print(f"DEFAULT {name} ok trace {tt:.1f}s plan {pt:.1f}s params={sum(p.numel() for p in m.parameters())/1e6:.0f}M "
                  f"nodes={len(tr.graph_module.graph.nodes)} {plan.summary().splitlines()[0][:150]} warns={ws}", flush=True)
        except ParallelizerError as e:
            print(f"DEFAULT {name} typed {type(e).__name__}: {str(e)[:500]}", flush=True)
        except Exception as e:
            import traceback
            print(f"DEFAULT {name} UNTYPED {type(e).__name__}: {str(e)[:500]}\n{traceback.format_exc()[-1500:]}", flush=True)
