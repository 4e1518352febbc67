"""Wrong numbers found by trying outside models and patterns (branch `trial`), each run on real gloo ranks
against the single-device model (eager, `rehearse`)."""
import contextlib
import io

import pytest

import parallelizer
from parallelizer.runtime.rehearsal import rehearse_many
from trial_models import (aux_loss_in_place, bn_fed_bias, bool_mask_fill, complex_rotary, ema_under_no_grad,
                          as_strided_of_transpose, embedding_grad_by_freq, spectral_norm_linear,
                          uneven_gather_as_strided)

pytestmark = pytest.mark.distributed


def _plan(builder, mesh, **options):
    model, inputs = builder()[:2]
    with contextlib.redirect_stdout(io.StringIO()):
        return parallelizer.plan(parallelizer.trace(model, inputs), mesh, **options)


@pytest.fixture(scope="module")
def two_rank_reports():
    cases = {"complex_rotary": (complex_rotary, _plan(complex_rotary, {"tp": 2}, axis_roles={"tp": "tp"})),
             "ema": (ema_under_no_grad, _plan(ema_under_no_grad, {"dp": 2}, axis_roles={"dp": "ddp"})),
             "bn_fed_bias": (bn_fed_bias, _plan(bn_fed_bias, {"dp": 2}, axis_roles={"dp": "ddp"})),
             "bool_mask": (bool_mask_fill, _plan(bool_mask_fill, {"dp": 2}, axis_roles={"dp": "ddp"})),
             "aux_in_place": (aux_loss_in_place, _plan(aux_loss_in_place, {"dp": 2}, axis_roles={"dp": "ddp"})),
             "grad_by_freq": (embedding_grad_by_freq,
                              _plan(embedding_grad_by_freq, {"dp": 2}, axis_roles={"dp": "fsdp"})),
             "as_strided": (uneven_gather_as_strided,
                            _plan(uneven_gather_as_strided, {"tp": 2}, axis_roles={"tp": "tp"})),
             "as_strided_t": (as_strided_of_transpose,
                              _plan(as_strided_of_transpose, {"dp": 2}, axis_roles={"dp": "ddp"})),
             "spectral_norm": (spectral_norm_linear, _plan(spectral_norm_linear, {"tp": 2}, axis_roles={"tp": "tp"}))}
    reports = rehearse_many([(fn, {}, plan) for fn, plan in cases.values()], steps=3)
    return dict(zip(cases, reports))


def test_gradient_through_complex_values_is_all_reduced_before_a_column_parallel_linear(two_rank_reports):
    """The gradient of the replicated complex-rotary region is Partial over tp (the next linear is column
    parallel): it is all-reduced (Megatron's f), so the first linear's gradient equals eager's. Before, the
    rewriter took complex values for non-differentiable (dtype.is_floating_point) and dropped the all-reduce:
    a.weight's gradient was off by 3e-2 (ratio ~3000 to the bound) while outputs and loss matched."""
    report = two_rank_reports["complex_rotary"]
    assert report.collectives.get("grad_all_reduce", 0) >= 1, report.rank0_code
    assert report.matches(), report


def test_a_buffer_written_under_no_grad_carries_no_gradient_history(two_rank_reports):
    """An EMA buffer updated in place inside torch.no_grad() from a.bias and an activation, read by the next
    step: on dp=2 (ddp) the parameters after 3 AdamW steps equal eager's. Before, the tracer detached only the
    no-grad region's outputs (an in-place write has none), so the buffer carried autograd history into the
    next step and its backward raised "Trying to backward through the graph a second time" on every rank."""
    report = two_rank_reports["ema"]
    assert report.matches(), report


def test_rounding_of_a_cancelling_sum_is_judged_against_a_float64_reference(two_rank_reports):
    """A bias feeding a BatchNorm on dp=2 (ddp, synchronised statistics): its gradient is 0 in exact
    arithmetic and about 7e-4 of fp32 rounding on one device and on the ranks, each in its own summation
    order. Judged against the float64 copy of the model (`rehearsal.float64_excess`: as far from float64 as
    one device is), the program matches; the plain fp32 bound (1e-5 + 1.3e-6 |ref| per element) flagged it
    (MobileViT's conv biases on tp=2: a false alarm at 11x the bound)."""
    report = two_rank_reports["bn_fed_bias"]
    assert report.matches(), report


def test_a_boolean_mask_index_put_shards_the_mask_with_the_batch(two_rank_reports):
    """`h[mask] = embed` with a (B, T) boolean mask on a (B, T, H) activation, dp=2 (ddp): the mask covers dims
    0 and 1 of h, so h is sharded with the mask along the batch. Before, the index_put rule counted one dim per
    index tensor and let h be sharded along T with the mask replicated: every rank raised IndexError (mask
    [4, 8] vs a local [4, 4, 16]); Wav2Vec2 with its default SpecAugment masking failed so on tp=2."""
    report = two_rank_reports["bool_mask"]
    assert report.matches(), report


def test_loss_plus_aux_loss_in_place_matches_under_ddp(two_rank_reports):
    """`loss += 0.1 * aux` on a mean cross-entropy (Mixtral / Qwen2-MoE with output_router_logits): planned on
    dp=2 (ddp) now that the tracer writes it out of place (before: InfeasiblePlanError), and equal to eager."""
    report = two_rank_reports["aux_in_place"]
    assert report.matches(), report


def test_embedding_scale_grad_by_freq_counts_ids_over_the_whole_batch(two_rank_reports):
    """nn.Embedding(scale_grad_by_freq=True) on dp=2 (fsdp): the embedding runs on the whole batch of ids (the
    rule no longer shards the indices), so each row's gradient is divided by its count in the whole batch as
    on one device. Before, each rank counted only its own half: emb.weight's gradient was off by 3.4e-3
    (ratio 342 to the bound) with outputs and loss equal (silent in training)."""
    report = two_rank_reports["grad_by_freq"]
    assert report.matches(), report


def test_as_strided_after_an_uneven_all_gather_reads_the_gathered_values(two_rank_reports):
    """A column-parallel linear of width 15 on tp=2 (shards 8, 7), gathered, then `as_strided` with the strides
    of a contiguous tensor: the all-gather's result is contiguous, so as_strided picks every other feature as on
    one device. Before, it was the padded buffer trimmed by `narrow` (strides (128, 16, 1)): outputs off by 1.7
    (ratio 1.3e5 to the bound), silently."""
    report = two_rank_reports["as_strided"]
    assert report.matches(), report


def test_spectral_norm_power_iteration_written_with_out_matches(two_rank_reports):
    """`nn.utils.spectral_norm` on tp=2: its power iteration writes the u / v buffers with
    `F.normalize(..., out=u)` (`aten.div.out`), now traced as div + copy_ into the buffer; outputs, gradients
    and the buffers after 3 steps equal eager's. Before, planning raised a bare IndexError ("tuple index out
    of range") in strategy enumeration: the `out` keyword was counted as an input of div."""
    report = two_rank_reports["spectral_norm"]
    assert report.matches(), report


def test_as_strided_of_a_transposed_activation_reads_its_values_under_ddp(two_rank_reports):
    """`h.transpose(1, 2).as_strided(size, strides into h's memory)` on dp=2 (ddp): the tracer rewrites
    as_strided to read its input's values (scattered at their traced storage positions first), so the ranks,
    whose input is a gathered fresh tensor, read what eager reads. Before: outputs off by 2.1 on every mesh
    (ddp, fsdp, tp=2, tp=3, dp x tp), silently."""
    report = two_rank_reports["as_strided_t"]
    assert report.matches(), report
