"""First touch of a pipeline rank's memory beyond the heap its allocator keeps between steps (issue 14; round 23,
rule corrected in round 27): the bytes each action of a step writes to pages the kernel must fault in, which
`planner.simulate` charges at `PipelineActionCost.first_touch_per_byte_s` (CPU work: it shares the cores).

The rule (`first_touch_bytes`): walking rank r's action list in order, the rank's live level is its in-flight
activations (F(x, i) adds model stage k's `StageTimes.act_bytes[k]`, I / B frees them: the peak walk of
`SimResult.peak_inflight_bytes`) plus the weight gradients of every stage whose first gradient-producing action on
the rank has run (B for a full backward, W for a split one: autograd's AccumulateGrad allocates `.grad` there, while
the action's saved activations are still held, and
the optimizer's `zero_grad(set_to_none=True)`, torch's default, frees it after the step, so every step allocates it
anew; `StageTimes.weight_grad_bytes[k]`). The allocator already holds `StageTimes.pool_bytes[r]` bytes when the
step starts; every action that raises the running maximum of the live level above the highest level so far (at
least the pool) touches the increment for the first time.

Why gradients, and why not "its own peak pays nothing" (round 27, r27c, measured with `getrusage` minor faults per
action on 4 gloo ranks, 8 GPT-2 blocks of width 512, 8 microbatches; benchmarks/RESULTS.md "Round 27 (r27c)"):
stepped ALONE in its own ranks (a user's steady state), GPipe's forwards touched 0-2 pages per step and its first
two backwards 1-38 MB per rank (its weight gradients, 24-26 MB, allocated while all 8 microbatches' activations are
live, then freed by zero_grad and returned to the kernel by glibc's heap trim: malloc(3) M_TRIM_THRESHOLD), while
1F1B touched none. So the kept heap is not the schedule's own activation peak: it is what the process's heap holds
(its set-up's free holes and every level a step reached without a trim), and a step pays for its live level above
that. Without act_bytes, pool_bytes or a per-byte cost nothing is charged (every closed form of `planner.simulate`).
"""
from __future__ import annotations

import numpy as np

from ..errors import PipelineError

_GRADIENT_KINDS = (2, 3)  # W, B (`planner.simulate`'s kind codes): the actions that accumulate weight gradients


def first_touch_bytes(c, times) -> np.ndarray:
    """(N,) bytes each action of compiled schedule `c` (`planner.simulate.compile_schedule`) touches for the first
    time beyond its rank's `times.pool_bytes` (module docstring): per rank, the increments of the running maximum
    of its live level (in-flight activations + the weight gradients allocated so far in the step), started at the
    pool. With `times.weight_grad_bytes` None, activations alone (round 23's walk).

    Args:
        c: a `planner.simulate._Compiled`; times: a `planner.simulate.StageTimes` with act_bytes and pool_bytes.
    Returns:
        N floats >= 0, bytes, in `c`'s node order; each rank's sum is max(0, live peak - pool).
    Raises:
        PipelineError: pool_bytes not one value >= 0 per rank, or given without act_bytes; weight_grad_bytes not
            S values >= 0.
    """
    pool = np.asarray(times.pool_bytes, dtype=float)
    if times.act_bytes is None or len(pool) != c.p or not np.isfinite(pool).all() or (pool < 0).any():
        raise PipelineError(f"StageTimes.pool_bytes {times.pool_bytes}: need {c.p} bytes >= 0 (one per rank) and "
                            "act_bytes (the in-flight bytes they are compared with)")
    act = np.asarray(times.act_bytes, dtype=float)
    grads = np.zeros(c.S) if times.weight_grad_bytes is None else np.asarray(times.weight_grad_bytes, dtype=float)
    if len(grads) != c.S or not np.isfinite(grads).all() or (grads < 0).any():
        raise PipelineError(f"StageTimes.weight_grad_bytes {times.weight_grad_bytes}: need {c.S} bytes >= 0 (one per "
                            "model stage)")
    out = np.zeros(len(c.kind))
    for r, idx in enumerate(c.by_rank):
        held = gradients_held(c, idx, grads)
        after = c.inflight_counts[r] @ act + held
        before = np.concatenate([[0.0], after[:-1]])
        within = before + np.diff(np.concatenate([[0.0], held]))  # gradients allocated while its inputs are live
        high = np.maximum.accumulate(np.concatenate([[pool[r]], np.maximum(within, after)]))
        out[idx] = np.diff(high)
    return out


def gradients_held(c, idx: np.ndarray, grads: np.ndarray) -> np.ndarray:
    """(len(idx),) weight-gradient bytes a rank holds after each of its actions `idx` (in list order): stage copy
    x's `grads[model stage]` from its first W or B on (module docstring) to the step's end."""
    held = np.zeros(len(idx))
    seen: set[int] = set()
    for n, node in enumerate(idx):
        x = c.actions[node].stage_index
        if int(c.kind[node]) in _GRADIENT_KINDS and x not in seen:
            seen.add(x)
            held[n:] += grads[c.stage[node]]
    return held
