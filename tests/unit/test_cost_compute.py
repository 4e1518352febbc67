"""cost_model.compute: FLOPs from torch.utils.flop_counter, bytes, roofline times, GPT closed form."""

import os

import pytest
import torch

from cost_model import H100_SXM, graph_flops, op_cost, op_flops

aten = torch.ops.aten


def meta(*shape, dtype=torch.float32):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_mm_flops_bytes_and_time():
    a, b, out = meta(1024, 2048, dtype=torch.bfloat16), meta(2048, 512, dtype=torch.bfloat16), meta(1024, 512, dtype=torch.bfloat16)
    cost = op_cost(aten.mm.default, (a, b), {}, out, H100_SXM)
    flops = 2 * 1024 * 2048 * 512
    nbytes = 2 * (1024 * 2048 + 2048 * 512 + 1024 * 512)
    assert (cost.fwd_flops, cost.bwd_flops, cost.fwd_bytes, cost.bwd_bytes) == (flops, 2 * flops, nbytes, 2 * nbytes)
    compute_s = flops / (989.5e12 * H100_SXM.matmul_efficiency)
    memory_s = nbytes / (3350e9 * H100_SXM.memory_efficiency)
    assert cost.fwd_s == pytest.approx(max(compute_s, memory_s) + H100_SXM.launch_overhead_s)
    assert cost.bwd_s == pytest.approx(2 * max(compute_s, memory_s) + 2 * H100_SXM.launch_overhead_s)


def test_linear_decomposes_to_counted_matmul():
    x, w, bias, out = meta(4, 128, 768), meta(3072, 768), meta(3072), meta(4, 128, 3072)
    assert op_flops(aten.linear.default, (x, w, bias), {}, out) == 2 * 4 * 128 * 768 * 3072
    q, k, scores = meta(2, 12, 64, 32), meta(2, 12, 32, 64), meta(2, 12, 64, 64)
    assert op_flops(aten.matmul.default, (q, k), {}, scores) == 2 * 2 * 12 * 64 * 32 * 64
    assert op_flops(aten.einsum.default, ("bij,bjk->bik", [meta(3, 4, 5), meta(3, 5, 6)]), {}, meta(3, 4, 6)) == 2 * 3 * 4 * 5 * 6


def test_elementwise_is_memory_bound_with_2x_backward_bytes():
    x = meta(4096, 4096, dtype=torch.float16)
    cost = op_cost(aten.gelu.default, (x,), {}, x, H100_SXM)
    assert cost.fwd_flops == cost.bwd_flops == 0
    assert cost.fwd_bytes == 2 * x.numel() * 2 and cost.bwd_bytes == 2 * cost.fwd_bytes
    assert cost.fwd_s == pytest.approx(cost.fwd_bytes / H100_SXM.achievable_bytes_per_s + H100_SXM.launch_overhead_s)


@pytest.mark.parametrize("target,args,out", [
    (aten.view.default, (meta(4, 6), [24]), meta(24)),
    (aten.transpose.int, (meta(4, 6), 0, 1), meta(6, 4)),
    (aten.permute.default, (meta(2, 3, 4), [2, 0, 1]), meta(4, 2, 3)),
    (aten.expand.default, (meta(1, 6), [4, 6]), meta(4, 6)),
    (aten.t.default, (meta(4, 6),), meta(6, 4)),
    (aten.unsqueeze.default, (meta(4, 6), 0), meta(1, 4, 6)),
    (aten.slice.Tensor, (meta(4, 6), 0, 0, 2), meta(2, 6)),
    (aten.select.int, (meta(4, 6), 0, 1), meta(6)),
    (aten.alias.default, (meta(4, 6),), meta(4, 6)),
    (aten.detach.default, (meta(4, 6),), meta(4, 6)),
    (aten.reshape.default, (meta(4, 6), [24]), meta(24)),
    (aten.to.dtype, (meta(4, 6), torch.float32), meta(4, 6)),
])
def test_view_ops_are_free(target, args, out):
    assert op_cost(target, args, {}, out, H100_SXM).total_s == 0.0


def test_copying_may_alias_ops_cost_bytes():
    non_contiguous = meta(6, 4).t()
    assert op_cost(aten.reshape.default, (non_contiguous, [24]), {}, meta(24), H100_SXM).fwd_bytes == 2 * 24 * 4
    cast = op_cost(aten._to_copy.default, (meta(4, 6),), {"dtype": torch.bfloat16}, meta(4, 6, dtype=torch.bfloat16), H100_SXM)
    assert cast.fwd_bytes == 24 * (4 + 2)


def test_embedding_reads_rows_not_table():
    table, ids, out = meta(50257, 768), torch.empty(2, 16, dtype=torch.long, device="meta"), meta(2, 16, 768)
    cost = op_cost(aten.embedding.default, (table, ids), {}, out, H100_SXM)
    assert cost.fwd_bytes == 2 * out.numel() * 4 + ids.numel() * 8


def test_unknown_dtype_for_flops_raises():
    a = meta(8, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="no peak FLOP/s for dtype torch.float64"):
        op_cost(aten.mm.default, (a, a), {}, a, H100_SXM)


@pytest.fixture(scope="module")
def gpt2_program():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_embd=768, n_layer=12, n_head=12, n_positions=1024, vocab_size=50257,
                                  attn_implementation="eager", use_cache=False)
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(cfg)
        ids = torch.zeros(2, 1024, dtype=torch.long)
    return cfg, torch.export.export(model, (ids,), strict=False)


def test_gpt2_flops_match_megatron_formula(gpt2_program):
    """Narayanan et al. SC'21 eq. (3) per iteration without recomputation (3x forward matmuls):
    72 B s l h^2 (1 + s/(6h) + V/(12 l h)), logits and attention matmuls included."""
    cfg, program = gpt2_program
    B, s, l, h, V = 2, 1024, cfg.n_layer, cfg.n_embd, cfg.vocab_size
    fwd, bwd = graph_flops(program.graph_module)
    megatron = 72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h))
    assert bwd == 2 * fwd
    assert (fwd + bwd) == pytest.approx(megatron, rel=0.03)
