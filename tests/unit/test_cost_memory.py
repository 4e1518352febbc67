"""cost_model.memory: ZeRO training state, saved activations vs Korthikanti et al. (2022)."""

import dataclasses
import os

import pytest
import torch

from cost_model.hardware import H100_SXM
from cost_model.memory import bytes_per_param
from cost_model.reserve import default_reserve_bytes
from cost_model import (activation_memory_bytes, graph_saved_activation_bytes, inflight_microbatches,
                        saved_tensor_owners,
                        saved_activation_bytes, training_state_bytes)

aten = torch.ops.aten


def meta(*shape, dtype=torch.float16):
    return torch.empty(shape, dtype=dtype, device="meta")


@pytest.mark.parametrize("precision, optimizer, per_param", [
    ("bf16", "adamw", (2, 4, 12)), ("bf16", "adam", (2, 4, 12)), ("bf16", "sgd", (2, 4, 4)),
    ("fp32", "adamw", (4, 4, 8)), ("fp32", "sgd", (4, 4, 0))])
def test_bytes_per_param_table(precision, optimizer, per_param):
    """Megatron's distributed-optimizer table: bf16 params + fp32 grads + fp32 main params + Adam m, v = 18;
    fp32 + Adam = 16 (ZeRO Sec. 3.1); SGD without momentum keeps no state beyond the fp32 main copy."""
    assert bytes_per_param(precision, optimizer) == per_param
    state = training_state_bytes(1_000_000, precision, optimizer=optimizer)
    assert (state.params_bytes, state.grads_bytes, state.optimizer_bytes) == tuple(b * 1_000_000 for b in per_param)


def test_llama_7b_state_closed_forms():
    """7e9 parameters, bf16 + AdamW: 126 GB on one device; Megatron's distributed optimizer over 8 ranks
    (ZeRO-1) 6 + 12/8 B/param; FSDP (ZeRO-3) over 8: 18/8 B/param."""
    psi = 7_000_000_000
    assert training_state_bytes(psi, "bf16").total_bytes == 126_000_000_000
    assert training_state_bytes(psi, "bf16", zero_stage=1, dp_size=8).total_bytes == 6 * psi + 12 * psi // 8
    assert training_state_bytes(psi, "bf16", zero_stage=3, dp_size=8).total_bytes == 18 * psi // 8


@pytest.mark.parametrize("n", [2, 8, 64])
def test_zero_stages_follow_paper_figure_1(n):
    psi = 7_680_000  # divisible by every n here
    assert training_state_bytes(psi, "bf16", zero_stage=3, dp_size=n).total_bytes == 18 * psi // n
    assert training_state_bytes(psi, "bf16", zero_stage=2, dp_size=n).total_bytes == 2 * psi + 16 * psi // n
    assert training_state_bytes(psi, "bf16", zero_stage=1, dp_size=n).total_bytes == 6 * psi + 12 * psi // n
    assert training_state_bytes(psi, "bf16", zero_stage=0, dp_size=n).total_bytes == 18 * psi
    assert training_state_bytes(psi, "fp32", zero_stage=1, dp_size=n).total_bytes == 8 * psi + 8 * psi // n


def test_default_reserve_is_a_gpu_fraction_plus_fixed_and_zero_on_cpu():
    assert default_reserve_bytes(H100_SXM) == int(0.10 * 80e9) + 1_000_000_000  # 9 GB of 80
    cpu = dataclasses.replace(H100_SXM, name="cpu", kind="cpu")
    assert default_reserve_bytes(cpu) == 0
    with pytest.raises(ValueError, match="kind='tpu'"):
        dataclasses.replace(H100_SXM, kind="tpu")


def test_training_state_validation():
    with pytest.raises(ValueError, match="zero_stage=4"):
        training_state_bytes(10, zero_stage=4)
    with pytest.raises(ValueError, match="precision='fp8'"):
        training_state_bytes(10, precision="fp8")
    with pytest.raises(ValueError, match="optimizer='lion'"):
        training_state_bytes(10, optimizer="lion")


def test_per_op_saved_bytes():
    x, w, out = meta(8, 64), meta(64, 32), meta(8, 32)
    assert saved_activation_bytes(aten.mm.default, (x, w), {}, out, param_args={1}) == x.numel() * 2
    assert saved_activation_bytes(aten.gelu.default, (x,), {}, x) == x.numel() * 2
    assert saved_activation_bytes(aten._softmax.default, (x, -1, False), {}, x) == x.numel() * 2
    assert saved_activation_bytes(aten.add.Tensor, (x, x), {}, x) == 0
    assert saved_activation_bytes(aten.view.default, (x, [-1]), {}, x.view(-1)) == 0
    assert saved_activation_bytes(aten.dropout.default, (x, 0.1, True), {}, x) == x.numel()  # 1-byte mask
    assert saved_activation_bytes(aten.dropout.default, (x, 0.1, False), {}, x) == 0
    assert saved_activation_bytes(aten.dropout.default, (x, 0.0, True), {}, x) == 0  # p=0: no mask
    q = meta(2, 4, 128, 16)  # (B, heads, s, head_dim): q, k, v, o and the fp32 logsumexp, no s x s matrix
    assert saved_activation_bytes(aten.scaled_dot_product_attention.default, (q, q, q), {"is_causal": True}, q) \
        == 4 * q.numel() * 2 + 2 * 4 * 128 * 4
    ln = saved_activation_bytes(aten.layer_norm.default, (x, [64], None, None), {}, x)
    assert ln == x.numel() * 2 + 2 * 8 * 4  # input + fp32 mean, rstd per row
    assert saved_activation_bytes(aten.mul.Tensor, (x, x), {}, x) == 2 * x.numel() * 2
    assert saved_activation_bytes(aten.mul.Tensor, (x, 0.5), {}, x) == 0
    ids = torch.empty(4, 16, dtype=torch.long, device="meta")
    assert saved_activation_bytes(aten.embedding.default, (meta(100, 64), ids), {}, meta(4, 16, 64), {0}) == 4 * 16 * 8


def test_gpt_layer_activations_match_korthikanti_eq1():
    """Korthikanti et al. 2022 eq. (1): s*b*h*(34 + 5*a*s/h) bytes per layer, fp16, with dropout,
    no parallelism. Config: GPT-2 block, h=768, a=12, s=512, b=2, exact GELU, dropout 0.1, train mode."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    b, s, h, a = 2, 512, 768, 12
    cfg = transformers.GPT2Config(n_embd=h, n_head=a, n_layer=1, n_positions=s, attn_implementation="eager",
                                  activation_function="gelu", use_cache=False)
    with torch.device("meta"):
        block = GPT2Block(cfg, layer_idx=0).to(torch.float16)
        x = torch.zeros(b, s, h, dtype=torch.float16)
    block.train()
    program = torch.export.export(block, (x,), strict=False)
    got = graph_saved_activation_bytes(program.graph_module, program.graph_signature.inputs_to_parameters)
    assert got == pytest.approx(s * b * h * (34 + 5 * a * s / h), rel=1e-3)  # README: within 0.1%


def test_activation_checkpointing_and_pipeline_inflight():
    per_block, block_input, layers = 1000, 100, 12
    assert activation_memory_bytes(per_block, layers) == 12_000
    assert activation_memory_bytes(per_block, layers, block_input, checkpoint=True) == 12 * 100 + 1000
    k = inflight_microbatches("1f1b", num_stages=4, num_microbatches=8, stage_index=0)
    assert k == 4 and inflight_microbatches("1f1b", 4, 8, stage_index=3) == 1
    assert inflight_microbatches("gpipe", 4, 8) == 8
    assert activation_memory_bytes(per_block, layers, inflight_microbatches=k) == 4 * 12_000
    with pytest.raises(ValueError, match="schedule='zb'"):
        inflight_microbatches("zb", 4, 8)


# --- one storage, one owner (cost_model.memory.saved_tensor_owners) ----------------------------------------

class _TwoLinears(torch.nn.Module):
    """x is saved by both linears: one storage."""

    def __init__(self, d: int = 16, h: int = 24):
        super().__init__()
        self.a, self.b = torch.nn.Linear(d, h), torch.nn.Linear(d, h)

    def forward(self, x):
        return self.a(x) + self.b(x)


class _SplitMul(torch.nn.Module):
    """q, k, v are views of one (B, 3D) projection; (q * k) * v saves q, k, v (all views) and q * k."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.qkv, self.d = torch.nn.Linear(d, 3 * d), d

    def forward(self, x):
        q, k, v = self.qkv(x).split(self.d, dim=-1)
        return (q * k) * v


class _SoftmaxMatmul(torch.nn.Module):
    """softmax saves its output, the matmul saves it again as its input: one storage."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.proj = torch.nn.Linear(d, d)

    def forward(self, x):
        s = self.proj(x)                        # (B, T, D)
        p = torch.softmax(s @ s.transpose(1, 2), dim=-1)  # (B, T, T)
        return p @ s


def _trace_saved(module, x):
    from parallelizer import trace
    tg = trace(module, (x,))
    resident = [ph for p in tg.parameters.values() for ph in p.placeholders]
    return tg, graph_saved_activation_bytes(tg.graph_module, resident)


def test_tensor_read_by_two_linears_is_saved_once():
    B, d = 8, 16
    x = torch.randn(B, d)
    tg, got = _trace_saved(_TwoLinears(d), x)
    assert got == B * d * 4  # x once (fp32); the weights are resident, add saves nothing
    owners = saved_tensor_owners(tg.graph_module, [ph for p in tg.parameters.values() for ph in p.placeholders])
    assert sorted(f for s in owners.values() for _, f in s.args) == [0.0, 0.0, 0.0]  # b's x, a's and b's weight


def test_views_of_one_storage_charge_the_whole_storage_once():
    B, d = 8, 16
    _, got = _trace_saved(_SplitMul(d), torch.randn(B, d))
    assert got == 4 * (B * d + B * 3 * d + B * d)  # x (by the linear) + the whole qkv storage + q * k


def test_softmax_output_saved_by_two_ops_counted_once():
    B, T, d = 2, 8, 16
    _, got = _trace_saved(_SoftmaxMatmul(d), torch.randn(B, T, d))
    # x (by proj) + s (by both matmuls, and as its transposed view) + softmax output (by softmax and p @ s)
    assert got == 4 * (B * T * d + B * T * d + B * T * T)


def test_planner_memory_row_counts_shared_saves_once():
    """The plan's activation bytes (a sum over nodes of `NodeCost.saved_bytes`) on dp=2 equal the closed
    forms above, halved by the batch sharding."""
    import contextlib
    import io

    import parallelizer
    B, T, d = 4, 8, 16
    for module, x, full in ((_TwoLinears(d), torch.randn(B, d), 4 * B * d),
                            (_SoftmaxMatmul(d), torch.randn(B, T, d), 4 * (2 * B * T * d + B * T * T))):
        tg = parallelizer.trace(module, (x,))
        with contextlib.redirect_stdout(io.StringIO()):
            plan = parallelizer.plan(tg, {"dp": 2}, axis_roles={"dp": "ddp"}, precision="fp32")
        assert plan.cost.memory_bytes["activations"] == full // 2
