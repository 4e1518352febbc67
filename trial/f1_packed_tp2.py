"""Packed llama (use_cache=True default, no attention_mask) on tp=2 and dp=2 against eager: prints each report."""
import sys, contextlib, io
sys.path.insert(0, "tests/distributed")
import parallelizer
from parallelizer.runtime.rehearsal import rehearse_many
from trial_models import packed_llama

if __name__ == "__main__":
    model, inputs, kwargs = packed_llama()
    traced = parallelizer.trace(model, inputs, kwargs)
    plans = [parallelizer.plan(traced, {"tp": 2}, axis_roles={"tp": "tp"}),
             parallelizer.plan(traced, {"dp": 2}, axis_roles={"dp": "ddp"})]
    for name, report in zip(["tp=2", "dp=2 ddp"], rehearse_many([(packed_llama, {}, p) for p in plans], steps=2)):
        print(name, "matches" if report.matches() else "MISMATCH", "ratio", report.ratio if hasattr(report, "ratio") else report)
