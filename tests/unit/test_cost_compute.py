"""cost_model.compute: FLOPs from torch.utils.flop_counter, bytes, roofline times, GPT closed form."""

import os

import pytest
import torch

from cost_model import H100_SXM, graph_flops, op_cost, op_flops
from cost_model.compute import MetaExecutionError

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


@pytest.mark.parametrize("target,args,kwargs,out,nbytes", [
    # x.to(x.device, torch.float32) on a float64 x: a real copy between dtypes on one device (8 + 4 bytes each)
    (aten.to.device, (meta(4, 6, dtype=torch.float64), torch.device("cpu"), torch.float32), {}, meta(4, 6), 24 * 12),
    # a non-contiguous input copied to a named device with its own dtype
    (aten.to.device, (meta(6, 4).t(), torch.device("cpu"), torch.float32), {}, meta(4, 6), 24 * 8),
    (aten.to.dtype_layout, (meta(4, 6),), {"dtype": torch.bfloat16, "device": torch.device("cpu")},
     meta(4, 6, dtype=torch.bfloat16), 24 * 6),
    (aten.to.dtype_layout, (meta(4, 6),), {"dtype": torch.bfloat16, "device": "cuda:0"},  # a device string
     meta(4, 6, dtype=torch.bfloat16), 24 * 6),
])
def test_ops_naming_a_device_are_priced_on_meta(target, args, kwargs, out, nbytes):
    """Issue 12 item 4: ops with device arguments ran on meta tensors with a real device and raised
    NotImplementedError "Cannot copy out of meta tensor"; they are priced as the copies they are."""
    cost = op_cost(target, args, kwargs, out, H100_SXM)
    assert (cost.fwd_flops, cost.fwd_bytes, cost.uncounted_flops) == (0, nbytes, None)


def test_ops_that_read_tensor_values_are_priced_by_bytes_and_say_so():
    """A composite op that cannot run on meta tensors at all (it reads a value) is priced by bytes; the
    reason is in `uncounted_flops` for the planner to record (Plan.fallbacks)."""
    cost = op_cost(aten.repeat_interleave.self_Tensor, (meta(3), torch.empty(3, dtype=torch.long, device="meta")),
                   {}, meta(5), H100_SXM)
    assert cost.fwd_flops == 0 and cost.fwd_bytes == 3 * 4 + 3 * 8 + 5 * 4
    assert "cannot count the FLOPs of aten.repeat_interleave.self_Tensor on meta tensors" in cost.uncounted_flops
    with pytest.raises(MetaExecutionError, match="Tensor.item"):
        op_flops(aten.item.default, (meta(),), {}, 1.0)


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
    assert (fwd + bwd) == pytest.approx(megatron, rel=1e-12)  # exact: the formula counts the same matmuls
    assert fwd == B * s * l * (24 * h * h + 4 * s * h) + 2 * B * s * h * V  # its integer form (eq. 3's derivation)


def test_llama_flops_match_palm_formula():
    """PaLM's model FLOPs per token (Chowdhery et al. 2022, App. B): 6 N + 12 L H Q T, with N the matmul
    parameters (attention q/k/v/o with grouped KV heads, the SwiGLU MLP's three matrices and the untied output
    head; the input embedding is a lookup) and 12 L H Q T the score and attention-x-V matmuls, forward and
    backward. Exact for a Llama (GQA, SwiGLU, untied head), as graph_flops counts the same matmuls."""
    transformers = pytest.importorskip("transformers")
    B, s, l, h, ffn, a, kv, V = 2, 16, 2, 64, 176, 4, 2, 300
    cfg = transformers.LlamaConfig(hidden_size=h, intermediate_size=ffn, num_hidden_layers=l, num_attention_heads=a,
                                   num_key_value_heads=kv, vocab_size=V, max_position_embeddings=s, use_cache=False)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
        ids = torch.zeros(B, s, dtype=torch.long)
    fwd, bwd = graph_flops(torch.export.export(model, (ids,), strict=False).graph_module)
    d = h // a
    n = l * (2 * h * h + 2 * h * kv * d + 3 * h * ffn) + V * h
    assert fwd + bwd == B * s * (6 * n + 12 * l * h * s)


def test_sdpa_is_one_fused_kernel_moving_q_k_v_o():
    """Flash attention: FLOPs of the two matmuls (4 * B * heads * s^2 * d, causal counted whole, as
    torch.utils.flop_counter does), bytes of q, k, v read and o written only (no s x s matrix), plus an explicit
    mask when one is given; backward 2x forward in both."""
    b, h, s, d = 2, 8, 1024, 64
    q = meta(b, h, s, d, dtype=torch.bfloat16)
    qkvo_bytes = 4 * b * h * s * d * 2
    cost = op_cost(aten.scaled_dot_product_attention.default, (q, q, q), {"is_causal": True}, q, H100_SXM)
    assert cost.fwd_flops == 4 * b * h * s * s * d
    assert (cost.fwd_bytes, cost.bwd_bytes) == (qkvo_bytes, 2 * qkvo_bytes)
    mask = meta(s, s, dtype=torch.bfloat16)
    masked = op_cost(aten.scaled_dot_product_attention.default, (q, q, q, mask), {}, q, H100_SXM)
    assert masked.fwd_bytes == qkvo_bytes + s * s * 2


@pytest.mark.parametrize("p, train, free", [(0.0, True, True), (0.1, False, True), (0.1, True, False)])
def test_dropout_with_p_zero_or_in_eval_is_free(p, train, free):
    x = meta(64, 128)
    cost = op_cost(aten.dropout.default, (x, p, train), {}, x, H100_SXM)
    assert (cost.total_s == 0.0 and cost.fwd_bytes == 0) == free


def test_pointwise_chain_is_priced_as_one_kernel():
    """y = x * sigmoid(x) + b, then a linear: the chain sigmoid -> mul -> add reads x once and b once, writes y
    once, and launches one kernel (cost_model.fusion)."""
    from cost_model.fusion import FusedIO, pointwise_fusion

    class Chain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x, b):
            return self.lin(x * torch.sigmoid(x) + b)

    gm = torch.export.export(Chain(), (torch.randn(4, 8), torch.randn(8))).graph_module
    fusion = pointwise_fusion(gm)
    assert fusion == {"sigmoid": FusedIO(frozenset(), True), "mul": FusedIO(frozenset({0, 1}), True),
                      "add": FusedIO(frozenset({0}), False)}
    x, b = meta(4, 8, dtype=torch.float32), meta(8, dtype=torch.float32)
    total, seconds = 0, 0.0
    for node, args in (("sigmoid", (x,)), ("mul", (x, x)), ("add", (x, b))):
        target = {"sigmoid": aten.sigmoid.default, "mul": aten.mul.Tensor, "add": aten.add.Tensor}[node]
        io = fusion[node]
        cost = op_cost(target, args, {}, x, H100_SXM, io.fused_args, io.output_fused)
        total, seconds = total + cost.fwd_bytes, seconds + cost.fwd_s
    assert total == x.numel() * 4 + b.numel() * 4 + x.numel() * 4  # x and b read once, y written once
    one_kernel = total / H100_SXM.achievable_bytes_per_s + H100_SXM.launch_overhead_s
    assert seconds == pytest.approx(one_kernel, rel=1e-12)


def test_composite_ops_move_the_bytes_of_their_decomposition():
    """cross_entropy_loss = _log_softmax (reads and writes the logits) + nll_loss_forward (reads them again and the
    targets; writes the loss and total weight), two kernels; linear keeps its one-kernel bytes."""
    n, c = 512, 2048
    logits, target, loss = meta(n, c), meta(n, dtype=torch.int64), meta()
    cost = op_cost(aten.cross_entropy_loss.default, (logits, target), {}, loss, H100_SXM)
    expected = (4 * n * c + 4 * n * c) + (4 * n * c + 8 * n + 4 + 4)
    assert cost.fwd_bytes == expected and cost.bwd_bytes == 2 * expected
    assert cost.fwd_s == pytest.approx(expected / (3350e9 * H100_SXM.memory_efficiency) + 2 * H100_SXM.launch_overhead_s)
    x, w, bias, out = meta(4, 128, 768), meta(3072, 768), meta(3072), meta(4, 128, 3072)
    assert op_cost(aten.linear.default, (x, w, bias), {}, out, H100_SXM).fwd_bytes == 4 * (x.numel() + w.numel()
                                                                                            + bias.numel() + out.numel())


def test_matmul_of_a_permuted_operand_pays_its_copy():
    """q (B, H, S, D) permuted from (B, S, H, D), as attention heads are split: its batch dims cannot be merged
    into one stride, so matmul clones it contiguous before bmm (a transposed last-two-dims operand needs no
    copy: bmm takes it as is)."""
    q = torch.empty_strided((2, 4, 64, 32), (8192, 32, 128, 1), device="meta")  # (2, 64, 4, 32).permute(0, 2, 1, 3)
    k, scores = meta(2, 4, 32, 64), meta(2, 4, 64, 64)
    plain = op_cost(aten.matmul.default, (meta(2, 4, 64, 32), k), {}, scores, H100_SXM).fwd_bytes
    assert plain == 4 * (q.numel() + k.numel() + scores.numel())
    assert op_cost(aten.matmul.default, (q, k), {}, scores, H100_SXM).fwd_bytes == plain + 2 * 4 * q.numel()
    k_t = torch.empty_strided((2, 4, 32, 64), (8192, 2048, 1, 32), device="meta")  # (.., 64, 32).transpose(-1, -2)
    assert op_cost(aten.matmul.default, (meta(2, 4, 64, 32), k_t), {}, scores, H100_SXM).fwd_bytes == plain
