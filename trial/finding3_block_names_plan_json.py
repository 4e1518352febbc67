"""Finding 3: a cross-attention with root-level q, k, v, o Linears (q/o on x, k/v on a longer y) has two
repeated-block groups that were both named "*"; the plan's JSON then did not read back
(PlanValidationError "['*', 0] names no block member, or one placed twice"), so `auto_parallelize` (which
broadcasts the plan as JSON) failed on every mesh, while `rehearse` (no JSON) matched.
Run: PYTHONPATH=$PWD python trial/finding3_block_names_plan_json.py"""
import contextlib
import io

import parallelizer
from trial.models import attn_plain_cross

if __name__ == "__main__":
    model, inputs = attn_plain_cross()
    traced = parallelizer.trace(model, inputs)
    print("blocks:", [b.name for b in traced.blocks])
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(traced, {"tp": 2}, axis_roles={"tp": "tp"})
    try:
        parallelizer.Plan.from_json(plan.to_json())
        print("plan JSON round trip: ok")
    except Exception as e:  # noqa: BLE001
        print("plan JSON round trip: ERROR", type(e).__name__, e)
