"""The fp32 rehearsal's second judge (`runtime.rehearsal.float64_excess`): a float64 copy of the single-device
model tells rounding of a cancelling sum from a wrong term; `same_computation` keeps it out when the float64
copy computed something else."""
import copy

import torch

from parallelizer.runtime.rehearsal import float64_excess, same_computation
from parallelizer.runtime.tolerance import excess


def _cancelling_sum(order: torch.Tensor, terms: torch.Tensor) -> torch.Tensor:
    """The sum of `terms` (fp32) in the given order: a gradient that is 0 in exact arithmetic."""
    return terms[order].sum(0)


def test_rounding_of_a_cancelling_sum_passes_and_a_wrong_term_fails():
    gen = torch.Generator().manual_seed(0)
    half = torch.randn(512, 8, generator=gen, dtype=torch.float64) * 100
    terms64 = torch.cat([half, -half])  # sums to exactly 0
    exact = terms64.sum(0)
    terms = terms64.float()
    one_device = _cancelling_sum(torch.arange(1024), terms)
    sharded = _cancelling_sum(torch.randperm(1024, generator=gen), terms)  # another summation order
    assert excess(sharded, one_device) > 1  # the plain fp32 bound flags the rounding
    assert float64_excess(sharded, one_device, exact) <= 1
    assert float64_excess(one_device, one_device, exact) <= 1 / 8
    wrong = sharded + terms[0]  # a doubled term: off by the size of the values
    assert float64_excess(wrong, one_device, exact) > 1


def test_same_computation_only_when_the_float64_copy_agrees_with_the_fp32_model():
    gen = torch.Generator().manual_seed(1)
    out64 = torch.randn(16, 32, generator=gen, dtype=torch.float64)
    assert same_computation([out64.float()], [out64], torch.float32)
    other_mask = out64 * (torch.rand(16, 32, generator=gen, dtype=torch.float64) > 0.1) / 0.9  # dropout redrawn
    assert not same_computation([out64.float()], [other_mask], torch.float32)
    assert not same_computation([out64.float()], [], torch.float32)


def test_a_nan_on_one_side_is_a_mismatch_not_a_zero_difference():
    """A pipeline whose microbatch loss is 0 / 0 (a masked mean over a microbatch without items) returned NaN
    for the batch loss and every gradient while one device's whole-batch loss was finite; `rehearse` said
    "numerics match ... worst |diff| / bound = 0.00", because max() and `>` ignore NaN (trial3a,
    trial/pipeline_extra_inputs.py). NaN against a finite value is now an infinite difference; NaN at the same
    places on both sides still compares the rest."""
    from parallelizer.runtime.rehearsal import _max_diff
    finite, nan = torch.tensor([1.0, 2.0]), torch.tensor([float("nan"), 2.0])
    diff, name, ratio = _max_diff([("loss", nan, finite)], torch.float32)
    assert diff == float("inf") and ratio == float("inf") and name == "loss"
    diff, name, ratio = _max_diff([("ok", finite, finite), ("loss", finite, nan)], torch.float32)
    assert ratio > 1 and name == "loss"
    diff, _, ratio = _max_diff([("same", nan, nan.clone())], torch.float32)
    assert diff == 0.0 and ratio <= 1


@torch.no_grad()
def test_an_inf_on_one_side_or_of_another_sign_is_a_mismatch():
    """One device's float16 loss over 70001 rows overflows to inf where the sharded program's local sums stay
    finite (round 12, r12c): `rehearse` said "numerics match ... 0.28", since inf / inf bounds read as NaN and
    max() drops NaN (its report even showed a difference of 1.8e308). An inf against a finite value, or against
    an inf of the other sign, is now an infinite ratio, under every judge; equal infs compare the rest."""
    from parallelizer.runtime.rehearsal import _max_diff
    finite, inf, neg = torch.tensor([1.5, 2.0]), torch.tensor([float("inf"), 2.0]), torch.tensor([float("-inf"), 2.0])
    for dtype in (torch.float16, torch.float32):
        a, b, c = finite.to(dtype), inf.to(dtype), neg.to(dtype)
        for pairs in ([("loss", a, b)], [("loss", b, a)], [("loss", b, c)], [("loss", a, b, a.float())]):
            diff, name, ratio = _max_diff(pairs, dtype)
            assert ratio == float("inf") and name == "loss", (dtype, pairs)
        diff, _, ratio = _max_diff([("same", b, b.clone(), a.float())], dtype)
        assert diff == 0.0 and ratio == 0.0


def test_a_differing_rehearsal_of_a_model_with_dropout_names_the_cause():
    """A rehearsal report that differs for a model drawing dropout masks (BERT's default hidden_dropout_prob 0.1:
    a pp=2 x dp=2 CLI rehearsal said only NUMERICS DIFFER, ratio 3533, trial4a) names the random ops and the
    remedy; dropout with p=0 is not named, and a matching report says nothing."""
    import dataclasses

    import torch

    from parallelizer.runtime.rehearsal import RehearsalReport, random_ops
    from parallelizer.tracer.trace import trace

    def model(p):
        return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(p), torch.nn.Linear(4, 1))

    x = torch.randn(2, 4)
    assert "dropout" in random_ops(trace(model(0.1), (x,)))
    assert random_ops(trace(model(0.0), (x,))) == ""
    assert random_ops(trace(model(0.1).eval(), (x,))) == ""

    class Attention(torch.nn.Module):  # BERT's SDPA path: the dropout is drawn inside the attention op
        def __init__(self, p):
            super().__init__()
            self.p = p

        def forward(self, h):
            return torch.nn.functional.scaled_dot_product_attention(h, h, h, dropout_p=self.p)

    h = torch.randn(2, 2, 3, 4)
    assert "scaled_dot_product_attention" in random_ops(trace(Attention(0.1), (h,)))
    assert random_ops(trace(Attention(0.0), (h,))) == ""
    report = RehearsalReport(2, 1.0, 1.0, 1.0, 1.0, "a", "b", 3533.0, {}, "", random="dropout (dropout.default)")
    assert "draws random numbers (dropout (dropout.default))" in str(report) and "dropout 0" in str(report)
    # round 20 (new-user trial r20g, defect 1): a VAE's randn_like has no dropout field: the remedy names inputs
    assert "passed in as inputs" in str(dataclasses.replace(report, random="randn_like (randn_like.default)"))
    assert "random" not in str(dataclasses.replace(report, tolerance_ratio=0.5))


class _HiddenState(torch.nn.Module):
    """A non-persistent buffer written in forward (a running mean of the activations; not in state_dict)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.register_buffer("running", torch.zeros(4), persistent=False)

    def forward(self, x):
        h = self.a(x)
        with torch.no_grad():
            self.running.mul_(0.9).add_(0.1 * h.mean(0))
        return h


def test_rehearsal_compares_non_persistent_buffers_written_in_forward():
    """Rehearsal compared parameters and buffers through state_dict(), which leaves non-persistent buffers out:
    a wrong running statistic kept in one would have gone unseen. `_non_persistent_buffers` gathers each one
    (here on one process) next to the references' values, and a difference is named."""
    import copy

    import parallelizer
    from parallelizer.runtime.rehearsal import _max_diff, _non_persistent_buffers

    model, x = _HiddenState(), torch.randn(8, 4)
    reference = copy.deepcopy(model)
    pm = parallelizer.auto_parallelize(model, (x,), cluster="h100:1x1")
    try:
        pm(x)
        reference(x)
        rows = _non_persistent_buffers(pm, pm.traced, [(reference, None)])
        assert [r[0] for r in rows] == ["running (non-persistent buffer)"]
        assert _max_diff(rows, torch.float32)[0] < 1e-6  # the program keeps it as one device does
        with torch.no_grad():
            pm.get_buffer("running").add_(1e-3)
        diff, name, ratio = _max_diff(_non_persistent_buffers(pm, pm.traced, [(reference, None)]), torch.float32)
        assert name == "running (non-persistent buffer)" and ratio > 1
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _low_precision_sums(dtype: torch.dtype, seed: int):
    """(exact, one device, sharded, missing reduction, doubled term) for a weight gradient of a 16-bit model
    that sums 1024 cancelling per-token terms: the float64 copy sums the unrounded terms, one device rounds each
    term to `dtype` (its activations) and sums in fp32 (CPU kernels accumulate in float), two ranks each round
    their partial sum to `dtype` before the reduction (a gradient all-reduce / reduce-scatter in the parameter
    dtype)."""
    gen = torch.Generator().manual_seed(seed)
    half = torch.randn(512, 8, generator=gen, dtype=torch.float64) * (100 if dtype == torch.bfloat16 else 10)
    terms64 = torch.cat([half, -half * (1 + 1e-3 * torch.randn(512, 8, generator=gen, dtype=torch.float64))])
    low = terms64.to(dtype)
    order = torch.randperm(1024, generator=gen)
    parts = [low[order[:512]].float().sum(0).to(dtype), low[order[512:]].float().sum(0).to(dtype)]
    sharded = (parts[0].float() + parts[1].float()).to(dtype)
    return (terms64.sum(0), low.float().sum(0).to(dtype), sharded, parts[0],
            (sharded.float() + low[0].float()).to(dtype))


def test_a_16_bit_model_is_judged_by_its_own_rounding_against_float64():
    """A bf16 or fp16 model's gradient that is a sum of cancelling terms (a bias feeding a BatchNorm) carries
    rounding of the terms' size on one device, and the sharded program other rounding of the same size: the
    plain bound of the dtype flagged it (a bf16 Linear -> BatchNorm1d -> Linear on dp=2: 28x / 33x on ddp / fsdp,
    fp16 480x / 497x), the float64 copy's judge, in the dtype's tolerances, accepts it; a missing reduction
    (one rank's partial sum) or a term counted twice stays outside."""
    for dtype in (torch.bfloat16, torch.float16):
        for seed in range(5):
            exact, one_device, sharded, missing, doubled = _low_precision_sums(dtype, seed)
            assert excess(sharded, one_device, dtype) > 1, (dtype, seed)
            assert float64_excess(sharded, one_device, exact) <= 1, (dtype, seed)
            assert float64_excess(missing, one_device, exact) > 10, (dtype, seed)
            assert float64_excess(doubled, one_device, exact) > 1, (dtype, seed)


def test_a_16_bit_copy_is_the_same_computation_within_its_dtype_only():
    """`same_computation` for a 16-bit program: rounding of 8 rtol of the dtype is the same computation, a
    redrawn dropout mask is not (and a 16-bit forward that draws random numbers is not judged by float64 at all,
    `wide_judged`)."""
    gen = torch.Generator().manual_seed(2)
    out64 = torch.randn(16, 32, generator=gen, dtype=torch.float64)
    assert same_computation([out64.bfloat16()], [out64], torch.bfloat16)
    assert not same_computation([out64.bfloat16()], [out64], torch.float32)  # fp32 programs: 1e-4
    other_mask = out64 * (torch.rand(16, 32, generator=gen, dtype=torch.float64) > 0.1) / 0.9
    assert not same_computation([out64.bfloat16()], [other_mask], torch.bfloat16)
    from parallelizer.runtime.rehearsal import wide_judged
    from parallelizer.tracer.trace import trace

    def model(p):
        return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(p)).bfloat16()

    x = torch.randn(2, 4, dtype=torch.bfloat16)
    assert wide_judged(torch.bfloat16, trace(model(0.0), (x,)))
    assert not wide_judged(torch.bfloat16, trace(model(0.1), (x,)))
    assert wide_judged(torch.float32, trace(model(0.1).float(), (x.float(),)))


class MakesFloat32(torch.nn.Module):
    """DAB-DETR's float32 sites in one forward (transformers' modeling_dab_detr.py): queries made in the default
    dtype (`torch.zeros(b, q, d)`), a sine embedding over an arange named float32, a cumsum named float32, a
    `.float()` and a softmax computed in float32 and cast back (`softmax(..., dtype=torch.float32).to(q.dtype)`)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.anchor = torch.nn.Linear(8, 8)

    def forward(self, x):  # (B, 8)
        queries = self.anchor(torch.zeros(x.shape[0], 8))  # DAB-DETR's ref_anchor_head on its zero queries
        dim_t = 100.0 ** (torch.arange(8, dtype=torch.float32) / 8)
        steps = torch.ones_like(x, dtype=torch.bool).cumsum(1, dtype=torch.float32)
        h = self.lin(x + queries + torch.sin(x.float() * 3.0 / dim_t) + steps)
        att = torch.softmax(h * 7.0, dim=-1, dtype=torch.float32).to(h.dtype)
        return (att * h).sum()


def _by_hand_in_float64(model: MakesFloat32, x: torch.Tensor) -> torch.Tensor:
    """`MakesFloat32`'s forward written out in float64 throughout (the value a float64 copy must compute)."""
    w, b, x = model.lin.weight.double(), model.lin.bias.double(), x.double()
    queries = model.anchor.bias.double()  # the anchor head of zeros is its bias
    dim_t = 100.0 ** (torch.arange(8, dtype=torch.float64) / 8)
    h = (x + queries + torch.sin(x * 3.0 / dim_t) + torch.arange(1, 9, dtype=torch.float64)) @ w.T + b
    return (torch.softmax(h * 7.0, dim=-1) * h).sum()


def test_a_model_that_makes_float32_tensors_in_forward_has_a_float64_copy():
    """DAB-DETR's forward makes float32 tensors of its own, so `model.double()` raised "mat1 and mat2 must have
    the same dtype" and its 5 plans were judged by the plain fp32 bound alone (NUMERICS DIFFER at 1.2-3.0x on a
    bias gradient one device's fp32 itself lies 3.1e-5 from float64 on; round 15). The float64 copy
    (`runtime.widen.as_float64`) now runs every call of such a forward in float64, its float32 softmax too (a
    `.double()` copy rounded it at float32: 1.9e-8 here, not the exact value the judge takes it for), and leaves
    the default dtype as it was, also after an error."""
    from parallelizer.runtime.rehearsal import _float64_run

    torch.manual_seed(0)
    model, x = MakesFloat32(), torch.randn(4, 8)
    expected = _by_hand_in_float64(model, x)
    run = _float64_run(copy.deepcopy(model), (x,), {})
    assert run is not None and not isinstance(run, str), run  # before: None (mat1 and mat2 must have the same dtype)
    out, (args, _) = run
    assert out.dtype == torch.float64 and args[0].dtype == torch.float64
    torch.testing.assert_close(out, expected, rtol=1e-13, atol=1e-13)
    assert (model(x).double() - expected).abs().item() > 1e-9  # float32 rounding alone: 1.9e-8, which 1e-13 sees
    assert torch.get_default_dtype() == torch.float32
    from parallelizer.runtime.widen import as_float64

    wide = as_float64(copy.deepcopy(model))
    for _ in range(2):  # every call (a rehearsal's steps), backward included
        wide.zero_grad()
        value = wide(x.double())
        value.backward()
        torch.testing.assert_close(value, expected, rtol=1e-13, atol=1e-13)
    reference = copy.deepcopy(model).double()
    _by_hand_in_float64(reference, x).backward()
    torch.testing.assert_close(wide.lin.weight.grad, reference.lin.weight.grad, rtol=1e-12, atol=1e-12)
    try:
        wide(x.double(), "an extra argument")
    except TypeError:
        pass
    assert torch.get_default_dtype() == torch.float32


def test_a_float64_judge_that_cannot_run_is_named_in_the_report():
    """When the float64 copy cannot run (a kernel without float64) or computes something else, a case outside
    the plain bound was reported NUMERICS DIFFER with nothing saying that no float64 judge ran; the report now
    says why (`unused_float64`, `NO_FLOAT64_JUDGE`)."""
    from parallelizer.runtime.rehearsal import _float64_run, _report, unused_float64

    class Float32Only(torch.nn.Linear):
        def forward(self, x):
            if x.dtype != torch.float32:
                raise RuntimeError("no float64 kernel\nsecond line")
            return super().forward(x)

    x = torch.randn(2, 4)
    model = Float32Only(4, 4)
    reason = unused_float64(_float64_run(copy.deepcopy(model), (x,), {}), model(x), torch.float32)
    assert reason == "the float64 copy of the model did not run (RuntimeError: no float64 kernel)", reason
    other = unused_float64((model(x).double() + 1, ((x.double(),), {})), model(x), torch.float32)
    assert "computed other outputs" in other
    assert unused_float64((model(x).double(), ((x.double(),), {})), model(x), torch.float32) == ""
    row = {"output": (0.0, "", 0.0), "loss": (0.0, "", 0.0), "grad": (3e-5, "b", 3.0), "params": (0.0, "", 0.0),
           "collectives": {}, "code": "", "float64_unused": reason}
    report = _report(2, [row, {**row, "float64_unused": ""}])
    assert not report.matches()
    assert "not judged against float64: the float64 copy of the model did not run" in str(report)
    assert "not judged against float64" not in str(_report(2, [{**row, "float64_unused": ""}]))


def test_the_float64_replay_is_stated_beside_the_verdict_not_instead_of_it():
    """`runtime.replay64.replay_note`: the worst rank's replay decides the text (equal within float64's bound:
    rounding; outside: a wrong program), a replay that could not run is named, and no replay says nothing; the
    verdict (`matches`) is the float32 comparison's whatever the replay found."""
    from parallelizer.runtime.rehearsal import _report
    from parallelizer.runtime.replay64 import replay_note

    row = {"output": (0.0, "", 0.0), "loss": (0.0, "", 0.0), "grad": (3e-4, "conv.bias", 3.5),
           "params": (0.0, "", 0.0), "collectives": {}, "code": ""}
    rounding = [{**row, "float64_replay": (6.4e-13, "conv.bias", 6.4e-6)},
                {**row, "float64_replay": (1e-13, "x", 1e-6)}]
    assert "equals the float64 model within float64's bound (worst |diff| 6.40e-13, conv.bias" in replay_note(rounding)
    wrong = [rounding[0], {**row, "float64_replay": (6.4e-5, "anchor.bias", 320.0)}]
    assert "differs from the float64 model too (worst |diff| 6.40e-05, anchor.bias, 320x" in replay_note(wrong)
    failed = [{**row, "float64_replay": "TraceError: x"}]
    assert "could not be replayed in float64 (TraceError: x)" in replay_note(failed)
    assert replay_note([row, row]) == ""
    report = _report(2, rounding)
    assert not report.matches() and "rounding of another summation order" in str(report)


def test_kinks_are_not_the_verdict_when_the_first_steps_gradients_are_within_bound():
    """`runtime.kinks.kinks_note`: a crossing found at the first forward explains a difference only where it
    acts, the first step's gradients; a difference only in the parameters after the steps (e.g. a wrong
    optimizer update, which the float64 replay of one forward and backward does not check) stays DIFFER."""
    from parallelizer.runtime.kinks import kinks_note

    crossing = [("relu", "relu (aten.relu.default)", 1, 0.0, 1.19e-7)]
    first_step = {"grad": (0.6, "w", 5e4), "kinks": crossing}
    later_only = {"grad": (1e-7, "w", 0.3), "params": (1e-3, "w", 50.0), "kinks": crossing}
    assert kinks_note([first_step, dict(first_step, kinks=[])]).startswith("1 element(s) crossed a kink")
    assert kinks_note([later_only, later_only]) == ""
    pipeline_later = {"grad": (0.6, "w (step 1)", 5e4), "kinks": crossing}
    assert kinks_note([pipeline_later]) == ""
    assert kinks_note([dict(pipeline_later, grad=(0.6, "w (step 0)", 5e4))]) != ""
    assert kinks_note([{"grad": (0.6, "w", 5e4), "kinks": None}]) == ""  # replay differed: not looked for
