"""What a rehearsal report judges and what it only shows (`runtime.rehearsal_report`, `runtime.whole_batch`).

A pipeline report's whole-batch pair (one device on the whole batch at once) is in the verdict only where it compares
the plan; left out, it is shown NOT JUDGED with the reason (`whole_batch.left_out`: a forward writing state, drawing
random numbers, or mixing the samples of its batch; `own_difference`: one device's own whole batch against its own
gradient accumulation). The loss after the steps is shown, not judged (the parameters after the steps are)."""
import torch
import torch.nn.functional as F
from torch import nn

from parallelizer.runtime.rehearsal_report import RehearsalReport, _report
from parallelizer.runtime.whole_batch import NOT_RUN_STATE, labelled, left_out, own_difference
from parallelizer.tracer import trace


def _rank(whole: tuple, note: str = "") -> dict:
    """One rank's result of a pipeline rehearsal (`pipeline_rehearsal._rank_main`'s keys) whose every judged pair
    lies at 0.5 of its bound, with the whole-batch pair `whole` (|diff|, name, ratio) and its `note`."""
    half = (1e-8, "x", 0.5)
    return {"output": half, "loss": half, "grad": half, "params": half, "buffers": half, "collectives": {},
            "code": "", "microbatches": 2, "whole_batch": whole, "whole_batch_note": note}


def test_a_whole_batch_pair_left_out_is_shown_not_judged_and_a_judged_one_decides_the_verdict():
    left = _report(2, [_rank((3.19, "step 1 (whole batch)", 0.0), "not comparable: the model mixes the samples"),
                       _rank((0.0, "", 0.0))])
    text = str(left)
    assert left.matches() and left.tolerance_ratio == 0.5, text
    assert "whole-batch loss 3.19e+00 NOT JUDGED (not comparable: the model mixes the samples)" in text, text
    assert text.count("3.19e+00") == 1 and "outputs" not in text, text  # not folded into the loss any more
    judged = _report(2, [_rank((3.19, "step 1 (whole batch)", 4e5)), _rank((0.0, "", 0.0))])
    assert not judged.matches() and judged.tolerance_ratio == 4e5, str(judged)  # before: ignored, "match"
    assert "whole-batch loss 3.19e+00 (one device on the whole batch at once: judged)" in str(judged), str(judged)
    not_run = _report(2, [_rank((0.0, "", 0.0), NOT_RUN_STATE)] * 2)
    assert f"whole-batch loss NOT JUDGED ({NOT_RUN_STATE})" in str(not_run), str(not_run)


def test_a_judged_whole_batch_pair_is_shown_judged_not_with_an_empty_reason():
    """`labelled` gives a pair with no reason to leave it out no note, so the report shows it judged (trial r24h:
    `rehearse pp.json` of README section 2 printed "whole-batch loss 4.77e-07 NOT JUDGED ( (measured |diff|
    4.77e-07, 0.0287x the bound, not judged))" for the pair its verdict judged)."""
    whole = (4.77e-07, "step 0 (whole batch)", 0.0287)
    assert labelled(whole, "") == ""
    text = str(_report(2, [_rank(whole, labelled(whole, ""))] * 2))
    assert "whole-batch loss 4.77e-07 (one device on the whole batch at once: judged)" in text, text
    assert "NOT JUDGED" not in text, text
    left = labelled(whole, "not comparable: the forward draws random numbers (dropout)")
    assert left == ("not comparable: the forward draws random numbers (dropout) (measured |diff| 4.77e-07, "
                    "0.0287x the bound, not judged)")


def test_the_loss_after_the_steps_is_labelled_as_shown_not_judged():
    report = RehearsalReport(2, 1e-7, 1e-7, 1e-7, 1e-7, "a", "b", 0.5, {}, "", final_loss=3.0)
    assert report.matches() and "loss after steps 3.00e+00 (shown, not judged: the params after steps are)" in \
        str(report), str(report)


def test_one_devices_own_difference_between_the_whole_batch_and_its_accumulation():
    one = torch.tensor(1.0, dtype=torch.float64)
    text = own_difference(one, one + 1e-3, 4, torch.float32)  # float32 bound at 1: 1e-5 + 1.3e-6
    assert text.startswith("not comparable: one device's own whole batch differs from its own gradient accumulation "
                           "over the same 4 microbatches by 1.00e-03 (88.5x the bound)"), text
    assert own_difference(one, one + 1e-7, 4, torch.float32) == ""


class _Net(nn.Module):
    """Per-sample blocks and a loss: "mean" (a mean of per-sample terms), "contrastive" (in-batch negatives),
    "bn" (BatchNorm in training: writes its running statistics), "dropout" (p = 0.5)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind, self.lin, self.bn = kind, nn.Linear(4, 4), nn.BatchNorm1d(4)

    def forward(self, x):  # (B, 4) -> 0-d loss
        h = self.lin(x)
        if self.kind == "bn":
            h = self.bn(h)
        if self.kind == "dropout":
            h = F.dropout(h, 0.5, True)
        if self.kind == "contrastive":
            z = F.normalize(h, dim=-1)
            return (-torch.diagonal(F.log_softmax(z @ z.t() / 0.2, dim=-1))).mean()
        return h.pow(2).mean()


def test_left_out_names_each_kind_of_pair_that_does_not_compare_the_plan():
    x, weights = torch.randn(8, 4, generator=torch.Generator().manual_seed(0)), torch.full((2,), 0.5,
                                                                                          dtype=torch.float64)

    def why(kind):
        torch.manual_seed(0)
        model = _Net(kind)
        return left_out(model, trace(model, (x[:4],)), (x,), {}, weights)

    assert why("mean") == ("", None)
    text, found = why("contrastive")
    assert text.startswith("not comparable: the model mixes the samples of its batch (the model's loss; "
                           "MicrobatchWarning)") and found[0] == "the model's loss", text
    assert why("bn") == (NOT_RUN_STATE, None)
    text, found = why("dropout")
    assert text.startswith("not comparable: the forward draws random numbers (") and found is None, text
