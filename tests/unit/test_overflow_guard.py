"""Training-time overflow guards (`if not torch.isfinite(h).all(): h = torch.clamp(h, +-(finfo.max - 1000))`,
16 transformers families: DETR, Conditional / Deformable DETR, Table Transformer, RT-DETR, D-FINE, Grounding DINO,
Mask2Former, ...): a Python branch on a tensor value, so every such model was refused in training mode (TraceError
at the `if`; round 15, trial r15b). Traced as the clamp alone where that clamp is the identity on finite values;
the program's values and gradients equal eager's in both arms. Other guards and float16 stay refused."""
import pytest
import torch
from torch import nn

import parallelizer
from parallelizer import TraceError
from parallelizer.tracer.overflow_guard import clamp_is_identity_on_finite


class GuardedLayer(nn.Module):
    """An encoder layer ending as transformers' DETR layers do (modeling_detr.py, training only)."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16, dtype=dtype), nn.Linear(16, 8, dtype=dtype)

    def forward(self, hidden_states):
        hidden_states = hidden_states + self.fc2(torch.relu(self.fc1(hidden_states)))
        if self.training:
            if not torch.isfinite(hidden_states).all():
                clamp_value = torch.finfo(hidden_states.dtype).max - 1000
                hidden_states = torch.clamp(hidden_states, min=-clamp_value, max=clamp_value)
        return hidden_states


class ZeroingGuard(GuardedLayer):
    """Another body under the same condition: not the identity on finite values' complement, so not rewritten."""

    def forward(self, hidden_states):
        hidden_states = self.fc2(torch.relu(self.fc1(hidden_states)))
        if not torch.isfinite(hidden_states).all():
            hidden_states = torch.zeros_like(hidden_states)
        return hidden_states


def _x(*poison):
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    for i, v in poison:
        x[i, 0] = v
    return x


@pytest.mark.parametrize("poison", [(), ((1, float("inf")), (2, -float("inf"))), ((3, float("nan")),)],
                         ids=["finite", "inf", "nan"])
def test_the_guard_traces_as_its_clamp_with_eager_values_and_gradients(poison):
    torch.manual_seed(0)
    model = GuardedLayer().train()
    traced = parallelizer.trace(model, (_x(),))
    assert any("overflow guard" in n and "test_overflow_guard.py" in n for n in traced.notes), traced.notes
    targets = [n.target for n in traced.graph_module.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.clamp.default in targets
    program = traced.exported.module()
    x1, x2 = _x(*poison).requires_grad_(), _x(*poison).requires_grad_()
    got, expected = program(x1), model(x2)  # eager: the clamp arm only when some value is not finite
    torch.testing.assert_close(got, expected, equal_nan=True)
    g1 = torch.autograd.grad(program(x1).nan_to_num().sum(), x1)[0]
    g2 = torch.autograd.grad(model(x2).nan_to_num().sum(), x2)[0]
    torch.testing.assert_close(g1, g2, equal_nan=True)


def test_float16_and_other_bodies_stay_refused():
    assert clamp_is_identity_on_finite(torch.float32) and clamp_is_identity_on_finite(torch.bfloat16)
    assert not clamp_is_identity_on_finite(torch.float16)  # max 65504: the clamp would move values above 64504
    with pytest.raises(TraceError, match="data-dependent control flow"):
        parallelizer.trace(GuardedLayer(torch.float16).train(), (_x().half(),))
    with pytest.raises(TraceError, match="data-dependent control flow"):
        parallelizer.trace(ZeroingGuard().train(), (_x(),))


def test_a_detr_family_model_traces_in_training_and_matches_eager():
    """transformers' TableTransformer (a DETR) with a small ResNet backbone: TraceError at
    modeling_table_transformer.py:533 before."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    backbone = transformers.ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                         layer_type="basic", out_features=["stage2"])
    config = transformers.TableTransformerConfig(
        use_timm_backbone=False, backbone_config=backbone, use_pretrained_backbone=False, d_model=16,
        encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=16,
        decoder_ffn_dim=16, num_queries=3, num_labels=2, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    model = transformers.TableTransformerForObjectDetection(config).train()
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    traced = parallelizer.trace(model, (), {"pixel_values": pixels})
    assert any("modeling_table_transformer.py" in n for n in traced.notes if "overflow guard" in n), traced.notes
    got = traced.exported.module()(pixel_values=pixels)
    expected = model(pixel_values=pixels)
    torch.testing.assert_close(got["pred_boxes"], expected.pred_boxes)
    torch.testing.assert_close(got["logits"], expected.logits)
