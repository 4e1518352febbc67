"""The rehearsal judges each compared tensor at the least precise dtype of the computation that reaches it
(`runtime.reach`), not at the least precise dtype of the whole graph (round 18, r18c).

Before, a float32 model with one float16 side branch was judged at float16 everywhere: an error of 0.1% of the
scale on its float32 path was a match (ratio 0.5 here). The reference values below are two eager programs that
differ by a known error: the model, and the same weights with its float32 path scaled by 1 + 1e-3
(`precision_models._skew`)."""
import copy
import sys
from pathlib import Path

import torch

import parallelizer
from parallelizer.runtime.reach import reach_dtypes
from parallelizer.runtime.rehearsal import _loss, _max_diff, _output_pairs
from parallelizer.runtime.tolerance import compute_dtype

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from precision_models import autocast_mlp, bf16_mlp, half_gate, half_side_branch  # noqa: E402

F16, F32, BF16 = torch.float16, torch.float32, torch.bfloat16


def test_a_float16_side_branch_reaches_only_its_own_tensors():
    reach = reach_dtypes(parallelizer.trace(*half_side_branch()))
    assert reach.outputs == {"output [0]": F16, "output [1]": F32, "output [2]": F16}
    assert reach.loss == F16 and reach.final_loss == F16 and reach.whole == F16
    assert reach.grads == {"fc1.weight": F32, "fc1.bias": F32, "fc2.weight": F32, "fc2.bias": F32,
                           "gate.weight": F16, "gate.bias": F16}
    assert reach.after_steps == reach.grads  # no parameter's gradient reads the gate's values
    assert reach.grad("not a parameter") == F16 and reach.param("a buffer") == F16  # the whole graph's: never tighter


def test_a_gate_that_multiplies_the_output_reaches_everything():
    """The product's backward reads the gate (d main = g * gate): every gradient carries its rounding."""
    reach = reach_dtypes(parallelizer.trace(*half_gate()))
    assert set(reach.outputs.values()) == {F16} and set(reach.grads.values()) == {F16} and reach.loss == F16


def test_autocast_and_bf16_models_are_judged_at_bf16_everywhere():
    for fn in (autocast_mlp, bf16_mlp):
        reach = reach_dtypes(parallelizer.trace(*fn()))
        assert set(reach.outputs.values()) == {BF16} and set(reach.grads.values()) == {BF16}, fn.__name__
        assert set(reach.after_steps.values()) == {BF16} and reach.loss == BF16, fn.__name__


def test_a_recipe_loosens_every_tensor_to_its_dtype():
    reach = reach_dtypes(parallelizer.trace(*half_side_branch())).with_recipe(BF16)
    assert reach.output("output [1]") == BF16 and reach.grad("fc1.weight") == BF16 and reach.final_loss == BF16


def _run(model, x, skew):
    model.zero_grad()
    model.skew = skew
    out = model(x)
    _loss(out).backward()
    return out, {k: p.grad.clone() for k, p in model.named_parameters()}


def test_a_sub_percent_error_on_the_float32_path_is_a_mismatch_and_the_float16_branch_still_matches():
    model, (x,) = half_side_branch()
    traced = parallelizer.trace(model, (x,))
    reach = reach_dtypes(traced)
    out, grads = _run(copy.deepcopy(model), x, 0.0)
    wrong_out, wrong_grads = _run(copy.deepcopy(model), x, 1e-3)  # 0.1% of the scale on the fp32 path

    def ratios(compute_out, compute_grad):
        outs = {name: _max_diff([(name, a, b)], compute_out)[2] for name, a, b in _output_pairs(wrong_out, [out])}
        return outs, {k: _max_diff([(k, wrong_grads[k], grads[k])], compute_grad)[2] for k in grads}

    before = ratios(compute_dtype(traced), compute_dtype(traced))  # the whole-graph rule: blind
    assert max(before[0]["output [1]"], before[1]["fc2.weight"]) <= 1.0
    outs, grad = ratios(reach.output, reach.grad)
    assert min(outs["output [1]"], grad["fc1.weight"], grad["fc2.weight"]) > 2  # measured 88, 6.4, ...
    assert outs["output [2]"] == 0 and grad["gate.weight"] == 0  # the branch the error does not reach
    right_out, right_grads = _run(copy.deepcopy(model), x, 0.0)  # the same program again: a match everywhere
    assert max(_max_diff(_output_pairs(right_out, [out]), reach.output)[2],
               *(_max_diff([(k, right_grads[k], grads[k])], reach.grad)[2] for k in grads)) <= 1.0


class _AuxThroughFc1(torch.nn.Module):
    """fc1's gradient takes a float16 auxiliary path; fc2's reads fc1's float32 output only."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)

    def forward(self, x):
        h = self.fc1(x)
        return self.fc2(torch.relu(h)).pow(2).mean() + 0.01 * h.half().float().mean()


def test_a_parameter_after_steps_carries_the_rounding_of_the_parameters_its_gradient_reads():
    """fc2's first gradient reads relu(fc1(x)) in float32; after one step fc1 holds a float16-rounded update, which
    the next step's gradient of fc2 reads: fc2 after the steps is judged at float16, its first gradient at float32."""
    reach = reach_dtypes(parallelizer.trace(_AuxThroughFc1(), (torch.randn(4, 16),)))
    assert reach.grads == {"fc1.weight": F16, "fc1.bias": F16, "fc2.weight": F32, "fc2.bias": F32}
    assert set(reach.after_steps.values()) == {F16}


def test_the_report_says_a_narrowing_model_was_judged_by_its_float64_replay():
    from parallelizer.runtime.replay64 import replay_note

    row = {"float64_replay": (3.0e-14, "fc1.weight", 2.4e-6), "replay_judges": True}
    assert "also replayed in float64 (casts widened" in replay_note([row, row])
    assert "3.00e-14, fc1.weight, 2.4e-06 of float64's bound" in replay_note([row])


class _ReadsItsOwnOperand(torch.nn.Module):
    """Two ops whose backward reads the operand the gradient flows to: a division's divisor (d/db a / b = -a / b^2)
    and an operand passed twice to einsum (d/dv v.v = 2 v). Both operands carry float16 rounding from a branch
    without parameters, so the gradients of `s` and `w` do too; the losses are scalars (nothing else reads them)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 8)
        self.s, self.w = torch.nn.Parameter(torch.ones(8)), torch.nn.Parameter(torch.zeros(8))

    def forward(self, x):
        side = x[:, :8].half().float()  # (B, 8), rounded to float16
        ratio = (self.fc(x) / (self.s + side.abs())).sum()
        v = self.w + side.sum(0)  # (8,)
        return ratio + torch.einsum("i,i->", v, v)


def test_an_operand_the_backward_reads_itself_brings_its_rounding():
    reach = reach_dtypes(parallelizer.trace(_ReadsItsOwnOperand(), (torch.randn(4, 16),)))
    assert reach.grads["s"] == F16 and reach.grads["w"] == F16  # before the fix of the op table: float32 (unsound)
    assert reach.grads["fc.weight"] == F16  # the numerator's gradient reads the divisor


class _WidenedBf16Leaves(torch.nn.Module):
    """RecurrentGemma's pattern (round 25, r25f): a bfloat16 buffer (`normalizer`, sqrt(d) rounded to bfloat16 at
    init, not persistent), a bfloat16 input and a bfloat16 constant made in forward, all widened to float32 before use; everything computed is float32.
    `narrow` computes in bfloat16 instead (x.bfloat16() * scale); `train_bf16` makes the scale a trainable
    bfloat16 parameter (after a step both sides hold bfloat16-rounded values of it: its rounding is real)."""

    def __init__(self, narrow: bool = False, train_bf16: bool = False) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)
        scale = torch.tensor(32 ** 0.5, dtype=BF16)
        if train_bf16:
            self.scale = torch.nn.Parameter(scale)
        else:
            self.register_buffer("scale", scale, persistent=False)
        self.narrow, self.skew = narrow, 0.0

    def forward(self, x, shift):
        h = self.fc1(x)
        h = (h.bfloat16() * self.scale).float() if self.narrow else h * self.scale.float()
        weight = torch.tensor([0.5, 1.5] * 4, dtype=BF16).float()  # a constant made in forward (lifted by export)
        return self.fc2(torch.relu(h + shift.float())) * weight * (1 + self.skew)


def test_a_16bit_leaf_that_forward_only_widens_is_no_16bit_computation():
    x, shift = torch.randn(4, 16, generator=torch.Generator().manual_seed(0)), torch.randn(4, 32).to(BF16)
    model = _WidenedBf16Leaves()
    traced = parallelizer.trace(model, (x, shift))
    reach = reach_dtypes(traced)
    assert compute_dtype(traced) == F32 and reach.whole == F32 and reach.loss == F32  # before the fix: bfloat16
    assert set(reach.outputs.values()) == {F32} and set(reach.grads.values()) == {F32}
    assert set(reach.after_steps.values()) == {F32}
    # the judge's bound is now float32's: a 1e-4 relative error of the program is a mismatch (at bfloat16's bound,
    # which main used, it matched), and the traced program itself (another op graph than eager) still matches
    out = model(x, shift)
    model.skew = 1e-4
    wrong = model(x, shift)
    model.skew = 0.0
    traced_out = traced.exported.module()(x, shift)  # the exported ATen program: another op graph than eager
    assert _max_diff([("out", wrong, out)], reach.output)[2] > 2
    assert _max_diff([("out", wrong, out)], lambda _: BF16)[2] <= 1.0
    assert _max_diff([("out", traced_out, out.detach())], reach.output)[2] <= 1.0
    # controls: a bfloat16 computation, and a trainable bfloat16 parameter, keep bfloat16's bound
    narrow = reach_dtypes(parallelizer.trace(_WidenedBf16Leaves(narrow=True), (x, shift)))
    assert narrow.loss == BF16 and narrow.grads["fc1.weight"] == BF16
    trained = reach_dtypes(parallelizer.trace(_WidenedBf16Leaves(train_bf16=True), (x, shift)))
    assert trained.grads["scale"] == BF16 and trained.after_steps["fc2.weight"] == BF16

