"""benchmarks/published/models.py: the models the published step-time comparisons price return their loss alone,
as Megatron-LM's and the Llama 3 trainer's last stage does (round 18). A model returning its logits has them returned
whole over dp and tp by our last stage, which made the Megatron H100 1.7B and 7.1B rows infeasible (51.5 GB of
logits at dp 48) and charged every other row memory Megatron does not spend."""
import pytest
import torch

from benchmarks.published.models import gpt_loss_only, llama_loss_only


def _outputs(tg):
    (out,) = [n for n in tg.graph_module.graph.nodes if n.op == "output"]
    return [v.meta["val"] for v in torch.utils._pytree.tree_leaves(out.args) if isinstance(v, torch.fx.Node)]


@pytest.mark.parametrize("build", [lambda: gpt_loss_only(2, 64, 4, 256, 32, "sdpa"),
                                   lambda: llama_loss_only(2, 64, 176, 4, 2, 256, 32)], ids=["gpt", "llama"])
def test_published_models_return_the_loss_alone(build):
    outs = _outputs(build())
    assert len(outs) == 1 and outs[0].shape == torch.Size([]) and outs[0].dtype.is_floating_point, \
        [(tuple(o.shape), o.dtype) for o in outs]


def test_published_scripts_trace_the_loss_only_models():
    """Every step-time script that traces a model goes through models.py (torchtitan's has its own LossOnly)."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[2] / "benchmarks" / "published"
    for name in ("steptime_megatron.py", "steptime_llama3.py", "breakdown_39b.py"):
        text = (root / name).read_text()
        assert "_loss_only(" in text and "zoo.gpt2(" not in text and "LlamaForCausalLM(" not in text, name
