"""Bytes priced to keep for backward = bytes autograd keeps, op by op (issue 13 item 5; RESULTS.md Round 23 (r23e)).

Each test traces a small model, prices every op as the planner does (`benchmarks.saved_by_node.priced_saved_bytes`)
and runs the traced program eagerly under saved-tensor hooks (`held_saved_bytes`: each storage charged once, to
its first saver), and asserts the two agree per node AND equal a closed form. One test per member of the class
"an op whose priced saved-for-backward bytes differ from what autograd keeps"; all of them failed before round 23.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import parallelizer
from benchmarks.saved_by_node import compare
from cost_model.compute import is_free_op

B, S, H, D = 2, 8, 2, 4  # batch, sequence, heads, head dim
F32 = 4  # bytes per float32 element


def _check(model: torch.nn.Module, inputs: tuple, closed_form_bytes: int) -> dict:
    torch.manual_seed(0)
    tg = parallelizer.trace(model.train(), inputs)
    res = compare(tg, inputs)
    assert res["nodes"] == [], f"priced vs held differ at (node, op, priced, held): {res['nodes']}"
    assert res["priced"] == res["held"] == closed_form_bytes, (res["priced"], res["held"], closed_form_bytes)
    return res


class _RotaryMul(torch.nn.Module):
    """q = x W; q * cos with cos computed from a buffer and positions (no gradient), as Llama's rotary."""

    def __init__(self) -> None:
        super().__init__()
        self.q = torch.nn.Linear(H * D, H * D, bias=False)
        self.register_buffer("inv_freq", torch.rand(H * D))

    def forward(self, x):
        cos = torch.cos(torch.arange(x.shape[1], dtype=torch.float32)[:, None] * self.inv_freq)  # (S, H*D)
        return (self.q(x) * cos).sum()


def test_mul_by_a_value_without_gradient_keeps_that_value_alone():
    """mul keeps an operand only when its PARTNER requires grad (derivatives.yaml, mul.Tensor): q * cos keeps cos
    (S, H*D), not q. Before: cos, being floating and large, was guessed to require grad, so q (B, S, H*D) was
    priced too: the reduced Llama's +384 B per token per layer (RESULTS.md Round 22 (r22e), "left")."""
    x = torch.randn(B, S, H * D)
    _check(_RotaryMul(), (x,), closed_form_bytes=B * S * H * D * F32 + S * H * D * F32)  # linear's x + cos


class _HeadsBack(torch.nn.Module):
    """relu over (B, H, S, D) laid out as (B, S, H, D), then the heads merged back by reshape (a view) into a
    Linear: the SDPA output -> o_proj path of transformers' attention."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(H * D, H * D, bias=False)
        self.out = torch.nn.Linear(H * D, H * D, bias=False)

    def forward(self, x):
        h = torch.relu(self.qkv(x).view(B, S, H, D).transpose(1, 2))  # (B, H, S, D), strides of (B, S, H, D)
        merged = h.reshape(B, -1, S, D).transpose(1, 2).reshape(B, S, -1)  # views: no copy
        return self.out(merged).sum()


def test_a_reshape_that_torch_does_as_a_view_is_free():
    """reshape of a NON-contiguous tensor whose strides allow a view is a view (at::computeStride): the Linear
    after it keeps relu's output storage, already kept by relu. Before: priced as a copy, kept twice."""
    x = torch.randn(B, S, H * D)
    _check(_HeadsBack(), (x,), closed_form_bytes=B * S * H * D * F32 * 2)  # qkv's x + relu's output
    t = torch.empty(B, S, H, D, device="meta").transpose(1, 2)  # (B, H, S, D) non-contiguous
    assert is_free_op(torch.ops.aten.reshape.default, (t, [B, H, S, D]), t.reshape(B, H, S, D))
    assert not is_free_op(torch.ops.aten.reshape.default, (t, [B, H * S * D]), torch.empty(B, H * S * D, device="meta"))


class _MaskedAttention(torch.nn.Module):
    def __init__(self, float_mask: bool) -> None:
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(H * D, H * D, bias=False) for _ in range(3))
        self.float_mask = float_mask

    def forward(self, x):
        def heads(t):
            return t.view(B, S, H, D).transpose(1, 2)
        mask = torch.ones(S, S, dtype=torch.bool).tril().expand(B, 1, S, S)
        if self.float_mask:
            mask = torch.zeros(B, 1, S, S).masked_fill(~mask, float("-inf"))
        out = F.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)), attn_mask=mask)
        return out.sum()


@pytest.mark.parametrize("float_mask", [False, True], ids=["bool_mask", "float_mask"])
def test_sdpa_keeps_its_mask_as_the_kernel_reads_it(float_mask):
    """SDPA keeps q, k, v, its output, the fp32 logsumexp (B, H, S) and its attn_mask in q's dtype: a bool mask
    converted (a new (B, 1, S, S) float tensor), a float mask as it is. Before: the mask was not priced."""
    x = torch.randn(B, S, H * D)
    qkv_out = 4 * B * H * S * D * F32
    _check(_MaskedAttention(float_mask), (x,),
           closed_form_bytes=B * S * H * D * F32 + qkv_out + B * H * S * F32 + B * S * S * F32)


class _Router(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(H * D, 4, bias=False)

    def forward(self, x):
        weights, idx = torch.topk(torch.softmax(self.gate(x), dim=-1), 2)  # (B, S, 2), int64 (B, S, 2)
        return weights.sum()


def test_topk_keeps_its_int64_indices():
    """topk (and sort, max.dim, ...) keeps its int64 indices for backward, not its input. Before: priced as
    keeping its input (already kept by softmax: 0 B), so the indices were missing (a MoE router's top-k)."""
    x = torch.randn(B, S, H * D)
    _check(_Router(), (x,), closed_form_bytes=B * S * H * D * F32 + B * S * 4 * F32 + B * S * 2 * 8)


class _Loss(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(H * D, 11, bias=False)

    def forward(self, x, target):
        return F.cross_entropy(self.head(x).flatten(0, 1), target.flatten())


def test_cross_entropy_keeps_its_total_weight():
    """cross_entropy keeps log_softmax's output (logits-sized), the int64 target and nll_loss's 0-d total_weight
    (4 B in fp32). Before: 4 B short."""
    x, target = torch.randn(B, S, H * D), torch.randint(0, 11, (B, S))
    tg = parallelizer.trace(_Loss().train(), (x, target))
    res = compare(tg, (x, target))
    assert res["nodes"] == [] and res["priced"] == res["held"] == B * S * (H * D + 11) * F32 + B * S * 8 + F32


@pytest.mark.parametrize("name", ["llama", "mixtral", "gpt2", "bert", "vit"])
def test_family_models_priced_as_held(name):
    """The zoo's transformers families (default options: SDPA attention, rotary, GQA, MoE router): the priced
    total equals the held one; Mixtral within 32 B per MoE layer (transformers' grouped_mm_fallback custom op is
    priced as keeping its int32 expert offsets, 8 x 4 B, which it does not). Before: Llama +15.7%, Mixtral +9.6%."""
    from parallelizer.zoo import families

    model, inputs, kwargs = getattr(families, name)()
    res = compare(parallelizer.trace(model, inputs, kwargs), inputs, kwargs)
    slack = 32 * 2 if name == "mixtral" else 0
    assert 0 <= res["priced"] - res["held"] <= slack, res
