"""Finding (trial6a): a loss_fn normalised by the microbatch's own size (`reduction="sum") / y.shape[0]`,
`/ y.numel()`, `/ len(y)`) or reducing over the batch dim before its final sum (`x.mean(0).sum()`) on a
pipeline: loss_weight skipped the division as a constant factor / took the final sum as a sum of per-item
terms, weighted each microbatch 1, and pm.step returned ~m times one device's loss with gradients to match
(pp=2 x tp=2, 4 microbatches: loss 69 off, gradients 1.5; `.mean(0).sum()` with 8 microbatches: 270 off).
After the fix: StepError naming the changing numbers / the reduction, remedy item_count= or a mean.
Run: PYTHONPATH=$PWD python -m trial.run5  (and trial.run3 for kl_mean0_sum); harness trial/h6a.py."""
from trial.run5 import SPECS
from trial.h6a import report

if __name__ == "__main__":
    report(SPECS[:2] + [{"name": "kl_mean0_sum pp2tp2 1f1b m8", "loss": "kl_mean0_sum", "mesh": {"pp": 2, "tp": 2},
                         "steps": 2, "opts": {"schedule": "1f1b", "microbatches": 8, "axis_roles": {"tp": "tp"}}}])
