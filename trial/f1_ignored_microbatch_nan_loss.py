"""Finding 1: pm.step on a pipeline plan returns NaN as the batch loss when ONE microbatch has every label
-100 (its mean cross-entropy is 0/0 = NaN, weighted by n_j / N = 0, and NaN * 0 = NaN), while one device's
loss of the whole batch is finite. Llama (own loss, labels=) with rows 0-3 (microbatch 0 of 2) all ignored,
on pp=2 x dp=2 and pp=2 x tp=2. Gradients: compared too (NaN on one side counts as inf)."""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import run, summarize

if __name__ == "__main__":
    for mesh, opts in [({"pp": 2, "dp": 2}, {"schedule": "1f1b"}),
                       ({"pp": 2, "tp": 2}, {"schedule": "gpipe", "axis_roles": {"tp": "tp"}})]:
        summarize(f"llama labels[0:4]=-100 {mesh}", run("llama_ign0_4", mesh, opts, steps=2))
