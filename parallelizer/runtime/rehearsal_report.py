"""The report of a rehearsal (`RehearsalReport`) and how the per-rank results become one (`_report`).

What a report states beside the measured differences: the reference it ran (recipe, float64 judge, ZeRO-1,
codec warm-up, float64 replay), a lossy codec whose deviation is reported unjudged (`unjudged_codec`), the
random ops or host state that keep a model from matching, and the elements that crossed a kink by rounding.
Split from `runtime.rehearsal` (round 23); that module re-exports every name.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..rewriter.spec import ShardingSpec
from ..tracer.host_state import HOST_STATE_LEADS
from .kinks import kinks_note
from .precision import describe


@dataclass(frozen=True, slots=True)
class RehearsalReport:
    """Largest absolute differences against the single-device model, over all ranks.

    Attributes: output, loss, grad (over every parameter), params (after the steps): the largest
        absolute difference (float). worst_grad / worst_param: the FQN with the largest difference.
        tolerance_ratio: the largest difference over its bound, over everything compared
            (`runtime.tolerance.excess`: torch.testing.assert_close's default rtol and atol for the least
            precise of the tensor's dtype and that of the computation reaching it, `runtime.reach`; elementwise
            for 32/64-bit floats, relative to the tensor's largest magnitude for 16-bit floats); <= 1 means a match.
        collectives: redistribution steps per kind in rank 0's emitted forward program (its stages' for a
            pipeline plan): one per (value, target layout), user inputs' slices included, local_slice moves no
            data, backward conjugates are not counted apart; `Plan.program_steps` gives the same per mesh axis
            (`show`'s column "in each rank's program"), `show`'s "plan edges" column counts one per use.
            rank0_code: rank 0's program source.
        compression: the gradient codec of the run (`GradCompression.spec`; "" = none).
        final_loss: largest |difference| of the loss after the steps (a forward of the stepped models); None
            where not measured (pipeline rehearsals).
        reference: what the single-device reference ran (`runtime.precision.describe`).
        buffers / worst_buffer: largest |difference| of a buffer after each step, over every stage copy, and
            its FQN; None where not measured (rehearsals without stages).
        microbatches: a pipeline rehearsal's microbatches (None: one program per rank, no stages). Its `loss` (and
            `output`: a pipeline returns only its loss) is every step's batch loss against one device's gradient
            accumulation over the same microbatches.
        whole_batch / whole_batch_note: a pipeline rehearsal's largest |difference| between its batch loss and
            one device's loss of the whole batch at once (None: not run), and why that pair is NOT in the verdict
            ("" when it is; `runtime.whole_batch.left_out`: a forward that writes state, draws random numbers or
            mixes the samples of its batch).
    The verdict (`tolerance_ratio`) covers `JUDGED`; `final_loss` is shown beside it, not judged (the parameters
    after the same steps are).
    """

    world_size: int
    output: float
    loss: float
    grad: float
    params: float
    worst_grad: str
    worst_param: str
    tolerance_ratio: float
    collectives: dict
    rank0_code: str
    compression: str = ""
    final_loss: float | None = None
    reference: str = describe(None)
    buffers: float | None = None
    worst_buffer: str = ""
    random: str = ""  # the random ops the traced forward draws from (`random_ops`), named when numbers differ
    grad_scale: float | None = None  # largest |gradient| of the one-device reference over every parameter
    grad_atol: float | None = None  # the absolute tolerance gradients are compared with
    kinks: str = ""  # elements that crossed a kink by rounding, with the float64 replay equal (`runtime.kinks`)
    microbatches: int | None = None
    whole_batch: float | None = None
    whole_batch_note: str = ""

    @property
    def blind(self) -> bool:
        """True when every gradient of the one-device reference is below the absolute tolerance it is compared
        with: any program whose gradients are as small matches, right or wrong (DPT's depth head at its
        initial weights: output 2.5e-8, largest gradient 5.7e-9 under atol 1e-5; round 9). Not a mismatch:
        the report says so and names the remedy."""
        return self.grad_scale is not None and self.grad_atol is not None and self.grad_scale < self.grad_atol

    def matches(self) -> bool:
        """True when every compared value is within its dtype-aware bound (`runtime.tolerance`), or when the
        values outside it come from elements that crossed a kink by rounding while the plan replayed in float64
        equals the float64 model (`kinks`, `runtime.kinks`; `tolerance_ratio` keeps the measured ratio)."""
        return self.tolerance_ratio <= 1.0 or bool(self.kinks)

    @property
    def expected_deviation(self) -> bool:
        """True for a run with a lossy codec (gradient or pipeline-boundary compression): its differences are
        measured and reported, not judged."""
        return bool(self.compression)

    def acceptable(self) -> bool:
        """The verdict of a rehearsal: the numerics match, or they deviate by design (gradient compression)."""
        return self.matches() or self.expected_deviation

    def __str__(self) -> str:
        if self.expected_deviation:
            verdict = (f"compression {self.compression} on: measured deviation from one device (expected "
                       "by design, not judged)")
        else:
            verdict = ("numerics match" + (f" ({self.kinks})" if self.kinks and self.tolerance_ratio > 1 else "")
                       if self.matches() else "NUMERICS DIFFER")
        return (f"{verdict} on {self.world_size} ranks (max |diff|): " + self._losses() + f", grads {self.grad:.2e} "
                f"({self.worst_grad}), params after steps {self.params:.2e} ({self.worst_param}), "
                + ("" if self.buffers is None else f"buffers {self.buffers:.2e} ({self.worst_buffer or '-'}), ")
                + self._whole_batch() + "loss after steps "
                + ("n/a" if self.final_loss is None else f"{self.final_loss:.2e} (shown, not judged: the params after "
                   "steps are)") + f"; worst |diff| / bound = {self.tolerance_ratio:.2f}; steps in rank 0's program "
                f"(forward, per kind; show: column \"in each rank's program\") {self.collectives}; reference: "
                f"{self.reference}"
                + ("" if not self.blind else
                   f"; NOTHING CHECKED: the one-device gradients are all below the absolute tolerance (largest "
                   f"|grad| {self.grad_scale:.2e} < atol {self.grad_atol:.0e}), so a wrong program with gradients "
                   "as small would match too; rehearse with the model's own loss (e.g. labels=) or inputs that give "
                   "outputs of order 1")
                + ("" if self.matches() or not self.random else
                   f"; the forward {_random_kind(self.random)} ({self.random}): ranks holding a shard of the batch "
                   "draw "
                   "their own masks / values (the same distribution, other numbers than one device), so such a "
                   "model cannot match; to check the plan, rehearse it with dropout 0 (e.g. transformers' *dropout* "
                   "config fields) and with other random tensors (randn_like noise, sampled timesteps) drawn in "
                   "the loop and passed in as inputs"))

    def _losses(self) -> str:
        """The outputs and loss the verdict judged, as the text shows them."""
        if self.microbatches is None:
            return f"outputs {self.output:.2e}, loss {self.loss:.2e}"
        return (f"loss {self.loss:.2e} (every step's, against one device's gradient accumulation over the same "
                f"{self.microbatches} microbatches; a pipeline returns only its loss)")

    def _whole_batch(self) -> str:
        """A pipeline report's whole-batch pair: its |diff| and whether the verdict used it (`whole_batch`)."""
        if self.microbatches is None:
            return ""
        if self.whole_batch_note:
            figure = "" if self.whole_batch is None or self.whole_batch_note.startswith("not run") else \
                f" {self.whole_batch:.2e}"
            return f"whole-batch loss{figure} NOT JUDGED ({self.whole_batch_note}), "
        return f"whole-batch loss {self.whole_batch:.2e} (one device on the whole batch at once: judged), "


JUDGED = ("output", "loss", "grad", "params", "buffers", "whole_batch")
"""The keys of a rank's result that the verdict covers (`_report`): each a (|diff|, name, ratio to the bound)."""


WARMUP_NOTE = "; the plan's PowerSGD ran within its warm-up ({} exact steps), so it is judged"


def unjudged_codec(spec: ShardingSpec, steps: int) -> tuple[str, str]:
    """(the gradient codec whose deviation a rehearsal of `steps` steps reports without judging it, "" when the
    codec leaves the sums exact over those steps; a note for the report's reference). A PowerSGD plan within
    its warm-up (`GradCompression.deviates_within`) is judged as an uncompressed one: its report said
    "expected by design, not judged" for exact all-reduces (a plan's default warm-up is 1000 steps)."""
    codec = spec.compression
    if codec.deviates_within(steps):
        return codec.spec, ""
    return "", WARMUP_NOTE.format(codec.warmup) if codec.lossy else ""


FLOAT64_JUDGE = (", and a float64 copy of it (each value may lie from float64's as far as 8x one device's own "
                 "rounding: sums that cancel)")
"""What `RehearsalReport.reference` adds when some rank judged by the float64 copy (`float64_excess`)."""
NO_FLOAT64_JUDGE = ("; not judged against float64: {}, so the plain bound alone judged (a sum of large terms that "
                    "cancel may exceed it by fp32 rounding alone)")
"""What `RehearsalReport.reference` adds when the float64 judge was wanted (some value outside the plain bound) but
could not be used (`unused_float64`)."""


def replay_note(results: list[dict]) -> str:
    """`runtime.replay64.replay_note` (imported on use: that module imports this one)."""
    from .replay64 import replay_note as note

    return note(results)


def no_float64_note(results: list[dict]) -> str:
    """`NO_FLOAT64_JUDGE` with the first rank's reason, when some rank wanted the float64 judge and could not use
    it; "" otherwise."""
    reason = next((r["float64_unused"] for r in results if r.get("float64_unused")), "")
    return NO_FLOAT64_JUDGE.format(reason) if reason else ""


ZERO1_NOTE = "; the plan was stepped by ZeroRedundancyOptimizer(AdamW) over {!r} (its zero1), the reference by AdamW"


def _report(world_size: int, results: list[dict], compression: str = "", recipe: str | None = None, note: str = ""
            ) -> RehearsalReport:
    def worst(key):
        return max(results, key=lambda r: r[key][0])[key]
    ratio = max(r[k][2] for r in results for k in JUDGED if k in r)
    # a model narrowing inside float32 is judged by its float64 replay too (`_rank_cases`, `reach.narrows_inside`)
    ratio = max([ratio, *(r["float64_replay"][2] for r in results
                          if r.get("replay_judges") and isinstance(r.get("float64_replay"), tuple))])
    buffers = worst("buffers") if all("buffers" in r for r in results) else None
    final = max(r["final_loss"][0] for r in results) if all("final_loss" in r for r in results) else None
    return RehearsalReport(world_size, worst("output")[0], worst("loss")[0], worst("grad")[0], worst("params")[0],
                           worst("grad")[1], worst("params")[1], ratio, results[0]["collectives"],
                           results[0]["code"], compression, final, describe(recipe) + (
                               FLOAT64_JUDGE if any(r.get("float64_judge") for r in results) else "") + (
                               ZERO1_NOTE.format(results[0]["zero1"]) if results and results[0].get("zero1") else "")
                           + note + no_float64_note(results) + replay_note(results),
                           None if buffers is None else buffers[0], "" if buffers is None else buffers[1],
                           results[0].get("random", ""),
                           max((r["grad_scale"][0] for r in results), default=None) if all(
                               "grad_scale" in r for r in results) else None,
                           results[0]["grad_scale"][1] if results and "grad_scale" in results[0] else None,
                           kinks_note(results), results[0].get("microbatches"),
                           worst("whole_batch")[0] if all("whole_batch" in r for r in results) else None,
                           next((r["whole_batch_note"] for r in results if r.get("whole_batch_note")), ""))


def _random_kind(random: str) -> str:
    """How a report words `random_ops`' text: host state frozen into the program (`frozen_host_state`) or draws."""
    return "reads host state it changes" if random.startswith(HOST_STATE_LEADS) else "draws random numbers"
