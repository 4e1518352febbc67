"""Choosing data-parallel gradient compression (`PlanConfig.compression`) and recording the choice in a plan.

The codecs and their prices are `cost_model.compression`'s; the runtime that applies them is
`rewriter.compression`. This module holds the decision rule, shared by the search (`planner.search`, per
candidate) and by plans on a given mesh (`choose_for_plan`, from `planner.steptime`):

* "none": never compress. "bf16" / "powersgd": compress every data-parallel gradient bucket (forced).
* "auto": the codec with the cheapest gradient sync, adopted only when it beats the uncompressed sync even if
  all of that sync that can hide under backward does hide (``DeviceSpec.comm_overlap`` x the backward
  seconds, as `cost_model.communication.overlapped_comm_exposed_s` bounds it): a lossy codec is never chosen
  for time that the runtime's overlap of the uncompressed all-reduce with backward already saves. On DGX
  clusters the sync of replicated gradients hides under backward, so "auto" keeps it exact; over slow links
  (``internet:8x1``) it does not, and compression wins by orders of magnitude. Then, over the whole plan,
  "auto" keeps a compressed plan only if its estimated step is at least `AUTO_MIN_SPEEDUP` times faster than
  the best uncompressed plan (`keeps_compression`); otherwise it takes that uncompressed plan.

The record (`Plan.compression`, `PipelinePlan.compression`, JSON key "compression"): {"option": the config's
value, "chosen": "none" | "bf16" | "powersgd", "rank": r (PowerSGD), "fidelity": what the codec loses,
"step_s": estimated step with the choice, "uncompressed_step_s": the best estimated step without compression,
"speedup": their ratio; PowerSGD also "warmup_steps" (`PlanConfig.powersgd_warmup`: the first optimizer steps
are all-reduced exactly, torch's `start_powerSGD_iter`) and "warmup_step_s" (this plan's estimated step without
compression, what each warm-up step costs)}. "step_s" and "speedup" are the steady state after the warm-up: the
planner does not know the run's length (a run of T > W steps averages (W warmup_step_s + (T - W) step_s) / T).
"""
from __future__ import annotations

from ..config import PlanConfig

__all__ = ["AUTO_MIN_SPEEDUP", "codecs_of", "choose", "keeps_compression", "fidelity", "make_record",
           "compression_line", "choose_for_plan"]

AUTO_MIN_SPEEDUP = 1.25
"""The estimated speedup over the best uncompressed plan that "auto" asks of a lossy codec. A policy, not a
measurement: a codec changes the training trajectory (PowerSGD's convergence matches exact all-reduce in
Vogels et al. 2019, Sec. 5, for the models measured there, which need not hold for yours), so a few percent of
estimated step time (within the cost model's error) do not justify it. Force a codec with
compression="powersgd" / "bf16" to use it anyway."""


def codecs_of(config: PlanConfig) -> tuple[str, ...]:
    """The lossy codecs `config.compression` lets the planner use: () for "none", both for "auto"."""
    return {"none": (), "auto": ("bf16", "powersgd")}.get(config.compression, (config.compression,))


def choose(option: str, none_floor_s: float, costs: dict[str, float]) -> str:
    """The codec for one plan (module docstring).

    Args:
        option: `PlanConfig.compression`.
        none_floor_s: seconds the uncompressed sync delays the step at best (its exposed part under full overlap).
        costs: codec -> seconds its sync delays the step (communication + codec compute), for the codecs of
            `codecs_of`; empty when there is nothing to compress (no data-parallel axis).
    Returns:
        "none", "bf16" or "powersgd".
    """
    if option == "none" or not costs:
        return "none"
    if option != "auto":
        return option
    best = min(costs, key=lambda k: (costs[k], k))
    return best if costs[best] < none_floor_s else "none"


def keeps_compression(option: str, chosen: str, step_s: float, uncompressed_step_s: float) -> bool:
    """Whether the plan keeps codec `chosen` at estimated `step_s` against the best uncompressed
    `uncompressed_step_s` (module docstring): forced options always do, "auto" needs `AUTO_MIN_SPEEDUP`."""
    if chosen == "none":
        return False
    return option != "auto" or uncompressed_step_s >= AUTO_MIN_SPEEDUP * step_s


def fidelity(chosen: str, rank: int) -> str:
    """What the codec gives up, in words (`cost_model.compression`)."""
    if chosen == "powersgd":
        return (f"PowerSGD rank {rank}: each gradient matrix (n x m) all-reduced as a rank-{rank} approximation "
                "P Q^T, the residual fed back into the next step (error feedback); 1-D gradients exact; "
                "warm-up steps exact")
    if chosen == "bf16":
        return "bf16 all-reduce: 8 significant bits, relative rounding error <= 2^-8 per element and cast"
    return "exact"


def make_record(config: PlanConfig, chosen: str, step_s: float, uncompressed_step_s: float,
                warmup_step_s: float) -> dict:
    """`Plan.compression` (module docstring); {} when the option is "none" (plans stay as before the option).
    `warmup_step_s`: the same plan's estimated step without compression (seconds; PowerSGD's warm-up steps)."""
    if config.compression == "none":
        return {}
    out = {"option": config.compression, "chosen": chosen, "fidelity": fidelity(chosen, config.powersgd_rank),
           "step_s": step_s, "uncompressed_step_s": uncompressed_step_s,
           "speedup": uncompressed_step_s / step_s if step_s > 0 else 1.0}
    if chosen == "powersgd":
        out.update(rank=config.powersgd_rank, warmup_steps=config.powersgd_warmup, warmup_step_s=warmup_step_s)
    return out


def compression_line(record: dict) -> str:
    """One line for `show` / summaries: the codec, its estimated speedup and fidelity."""
    if record.get("chosen", "none") == "none" and record.get("option") in ("bf16", "powersgd"):
        # a forced codec is dropped only when there is nothing to compress (`choose`: no bucket)
        return (f"gradient compression: none: option {record['option']!r} compresses the data-parallel gradient "
                "sync, and this plan has none (no gradient all-reduce / reduce-scatter: no 'dp' axis, or the "
                "planner replicated the batch, so every gradient is complete on its rank). Remedy: force data "
                "parallelism (--roles dp=ddp, axis_roles={'dp': 'ddp'}), or --compression none")
    if record.get("chosen", "none") == "none":
        return (f"gradient compression: none (option {record.get('option')!r}; no codec beats the uncompressed "
                f"sync, estimated step {record.get('step_s', 0) * 1e3:.1f} ms)")
    warmup = (f"; the first {record['warmup_steps']} steps exact (warm-up, {record['warmup_step_s'] * 1e3:.1f} ms "
              "each), the step above after them" if record.get("warmup_steps") else "")
    return (f"gradient compression: {record['chosen']} (option {record['option']!r}), estimated step "
            f"{record['step_s'] * 1e3:.1f} ms vs {record['uncompressed_step_s'] * 1e3:.1f} ms uncompressed "
            f"({record['speedup']:.1f}x){warmup}; fidelity: {record['fidelity']}")


def choose_for_plan(traced, plan, topology, config: PlanConfig) -> dict:
    """The compression record of a plan on a given mesh: `planner.steptime.estimate_step_time` of the plan
    with each allowed codec, chosen by `choose` (module docstring). {} when `config.compression` is "none".

    Raises:
        PlanMismatchError: from `estimate_step_time` (plan made for another graph).
    """
    from .steptime import estimate_step_time  # steptime imports planner modules that import this one
    if config.compression == "none":
        return {}
    base = estimate_step_time(traced, plan, topology=topology)
    costs, steps = {}, {}
    for codec in codecs_of(config):
        t = estimate_step_time(traced, plan, topology=topology, compression=codec, powersgd_rank=config.powersgd_rank)
        if t.buckets:
            costs[codec], steps[codec] = t.grad_sync_exposed_s + t.codec_s, t.total_s
    chosen = choose(config.compression, base.grad_sync_exposed_s, costs)
    if not keeps_compression(config.compression, chosen, steps.get(chosen, base.total_s), base.total_s):
        chosen = "none"
    return make_record(config, chosen, steps.get(chosen, base.total_s), base.total_s, base.total_s)
