"""`plan_pipeline`: outer search over mesh shapes (pp, dp, tp), microbatch counts and pipeline schedules.

For every candidate (pp, dp, tp, m, schedule) with pp * dp * tp = the cluster's devices:

1. per-segment prices on tp devices come from ONE intra-stage ILP solve per tp (`segments.price_segments`),
   scaled to the microbatch size mb = global_batch / (dp m);
2. the blocks are partitioned into pp * v stages by the min-max DP of `partition.py` under the memory
   budget, each stage keeping the schedule's in-flight microbatches (`schedules.inflight_microbatches`);
   the even split is priced too and the better feasible one kept (`_Context.evaluate` says why); each
   stage takes the cheapest activation-recomputation mode that fits its in-flight microbatches
   (`PlanConfig.recompute`: "auto" chooses among none / selective / full, another value forces it;
   `segments.SegmentPrices.rc_extra_lin` adds the recomputed forward to B, `rc_act_delta` changes the
   saved bytes); the budget is the device's (or `memory_budget_bytes`) minus the reserve, exactly as
   `parallelizer.plan` (`api.memory_budget`);
   point-to-point transfers at the cuts use Megatron's scatter/gather (Narayanan et al. 2021, Sec. 4.1):
   each tp rank sends 1/tp of the activation over the pipeline link (`send_recv` on the "pp" axis), then
   an all-gather over "tp" inside the node rebuilds it; with `PlanConfig.boundary_compression` the send
   is priced at the codec's wire bytes plus its encode/decode time, per cut the cheapest allowed codec
   (`planner.boundary`), and the partition is priced with and without (`_Context.evaluate`);
3. step time = pipeline time of the bottleneck rank (`schedules.pipeline_time_s`) + the all-reduce of each
   rank's gradients over "dp" (no overlap with backward; with ZeRO-1 the reduce-scatter + all-gather moves
   the same bytes) + the exchange of tied-embedding gradients between the first and last rank.
   With `PlanConfig.compression` other than "none" the dp sync of each candidate may be compressed
   (`planner.compression.choose`): a codec's sync is its all-reduces of the compressed bytes plus its compute
   (`cost_model.compression`, the rank's gradients as one bucket), and "auto" takes it only when it beats
   the uncompressed sync even fully overlapped with the rank's backward (`DeviceSpec.comm_overlap`).

Pruning (branch and bound): a candidate's step time is at least
    LB = m * sum(segment seconds per microbatch) / pp + all_reduce(sum(gradient bytes) / pp over dp)
(the bottleneck rank does at least the average work, the bubble is >= 0, and the all-reduce time is affine
in bytes so the largest rank's is >= the average's). The segment seconds are those without recomputation,
which only adds time, so LB stays a lower bound under any recomputation choice. A candidate whose average
rank memory (all state plus the leanest mode's activations times the fewest in-flight microbatches, / pp)
exceeds the budget cannot fit and is not partitioned. Candidates are priced in increasing LB order and the
search stops once LB exceeds the best step time found, so it returns exactly the optimum of the exhaustive
grid (`search="exhaustive"`), typically after pricing a small fraction of it. With compression allowed the
sync term of LB is 0 (a codec may shrink it arbitrarily), and a second bound pass over the same (cached)
prices finds the best uncompressed step, against which the plan reports its speedup.

Throughput: model FLOPs per step = `cost_model.graph_flops` of the traced graph (forward + 2x forward for
backward, no recomputation) x global_batch / trace batch; TFLOP/s per GPU = FLOPs / (step time x devices);
MFU = that / the device's dense peak for the model's parameter dtype (Chowdhery et al. 2022, App. B).
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from cost_model.communication import collective_time_s
from cost_model.compression import compressed_sync, compressed_sync_time_s
from cost_model.compute import graph_flops
from cost_model.topology import Cluster, MeshTopology, get_cluster

from ..config import PlanConfig
from ..core.mesh import MeshSpec
from ..errors import InfeasiblePlanError, format_bytes
from ..tracer import TracedGraph
from . import boundary
from .api import memory_budget
from .compression import choose, codecs_of, keeps_compression, make_record
from .costs import resolve_precision, traced_in_low_precision
from .partition import ChainCosts, partition_chain, uniform_partition
from .recompute import RECOMPUTE_MODES
from .pipeline import PipelinePlan, RankCost, SearchReport, StageKindSummary, StageSpec
from .schedules import (SCHEDULES, bubble_fraction, bubble_ratio, get_schedule, inflight_microbatches,
                        invalid_reason, pipeline_time_s, rank_of_stage)
from .segments import COMM_KINDS, SegmentPrices, Segments, price_segments, segment_graph

AXES = ("pp", "dp", "tp")
_GB = 1e9


@dataclass(frozen=True, slots=True, order=True)
class Candidate:
    """One point of the search space; ordering = the deterministic tie-break."""

    pp: int
    dp: int
    tp: int
    num_microbatches: int
    schedule: str


def plan_pipeline(traced: TracedGraph, cluster: Cluster | str, *, global_batch: int,
                  memory_budget_bytes: int | None = None, pp: int | tuple[int, ...] | None = None,
                  tp: int | tuple[int, ...] | None = None, num_microbatches: int | tuple[int, ...] | None = None,
                  schedules: tuple[str, ...] | None = None, zero1: bool = True, config: PlanConfig | None = None,
                  search: str = "bound", partitioner: str = "dp", progress: bool | None = None,
                  **options) -> PipelinePlan:
    """Choose mesh (pp, dp, tp), schedule, microbatches and stages for training `traced` on `cluster`.

    Args:
        traced: from `parallelizer.trace`, typically of a model on the meta device traced with ONE sample
            (any batch b0 works: prices scale by microbatch / b0, see `segments.py`). Needs repeated blocks.
        cluster: a `cost_model.topology.Cluster` (e.g. `dgx_a100(64)`) or a preset string "a100:64x8".
        global_batch: samples per optimizer step over all replicas; must split as dp x microbatches x mb.
        memory_budget_bytes: per device; default the device's HBM. The plan's tensors must fit this minus
            the reserve (`PlanConfig.memory_reserve_bytes`, `api.memory_budget`: as `parallelizer.plan`).
        pp, tp, num_microbatches: restrict the search to these values (an int or a tuple); tp must divide
            the devices per node (tensor parallelism stays inside a node).
        schedules: names from `schedules.SCHEDULES` (default: all: gpipe, 1f1b, interleaved_1f1b, zbv).
        zero1: shard optimizer state over dp (Megatron's distributed optimizer, ZeRO stage 1).
        config / options: `PlanConfig` fields for the intra-stage ILP (optimizer, precision, solver...).
        search: "bound" (branch and bound, exact) or "exhaustive" (price every candidate).
        partitioner: "dp" (balanced, memory-aware) or "uniform" (equal blocks per stage, for comparison).
        progress: tqdm bar over candidates; None = only on a terminal.
    Returns:
        The best `PipelinePlan` (lowest estimated step time; ties by (pp, dp, tp, m, schedule)).
    Raises:
        ValueError: bad arguments, or a fixed (dp, m) that does not divide global_batch; the text says why.
        InfeasiblePlanError: no candidate fits the memory budget; names the smallest need and remedies.
    """
    start = time.perf_counter()
    cluster = get_cluster(cluster) if isinstance(cluster, str) else cluster
    if not (isinstance(global_batch, int) and global_batch >= 1):
        raise ValueError(f"global_batch={global_batch!r}: must be an int >= 1 (samples per optimizer step)")
    if search not in ("bound", "exhaustive") or partitioner not in ("dp", "uniform"):
        raise ValueError(f"search={search!r}, partitioner={partitioner!r}: use 'bound'|'exhaustive', 'dp'|'uniform'")
    config = dataclasses.replace(config or PlanConfig(), **options)
    if memory_budget_bytes is not None:
        config = dataclasses.replace(config, memory_budget_bytes=memory_budget_bytes)
    total_budget, reserve = memory_budget(config, cluster.device)
    budget = total_budget - reserve
    ctx = _Context(traced, segment_graph(traced), cluster, config, budget, global_batch, zero1, partitioner)
    ctx.reserve = reserve
    cands, excluded, total = _enumerate(ctx, _tuple(pp), _tuple(tp), _tuple(num_microbatches),
                                        tuple(schedules or SCHEDULES))
    bounds = sorted((ctx.lower_bound_s(c), c) for c in cands)
    with tqdm(total=len(bounds), desc="pipeline search", disable=(None if progress is None else not progress),
              leave=False) as bar:
        best, evaluated, infeasible, leanest = _bound_search(ctx, bounds, "step_s", search, bar)
    if best is None:
        need, cand = leanest
        raise InfeasiblePlanError(
            f"memory: no pipeline configuration fits {format_bytes(budget)} per device "
            + (f"(after a reserve of {format_bytes(reserve)}) " if reserve else "")
            + (f"with recompute={config.recompute!r} " if config.recompute != "auto" else "with recomputation ")
            + f"on {cluster.world_size} "
            f"{cluster.device.name} devices; the leanest (pp={cand.pp}, dp={cand.dp}, tp={cand.tp}, "
            f"m={cand.num_microbatches}, {cand.schedule}) needs {format_bytes(need)} per device. Remedies: more "
            "devices, a smaller global batch or more microbatches, bf16 precision (precision='bf16'), "
            "ZeRO-1 (zero1=True), "
            + ("activation recomputation (recompute='auto' or 'full'), " if config.recompute in ("none", "selective")
               else "") + "a smaller memory reserve (memory_reserve_bytes=).")
    report = SearchReport(total, dict(sorted(excluded.items())), len(bounds) - evaluated, evaluated, infeasible,
                          len(ctx.cache), time.perf_counter() - start)
    uncompressed = best[2]["uncompressed_step_s"]
    if ctx.codecs:  # the best plan without compression (its own bound pass; prices and results are cached)
        plain = sorted((ctx.lower_bound_s(c, compressed=False), c) for c in cands)
        uncompressed, cand, res = _bound_search(ctx, plain, "uncompressed_step_s", search, None)[0]
        if not keeps_compression(config.compression, best[2]["compression"], best[0], uncompressed):
            best = (uncompressed, cand, dict(res, step_s=uncompressed, dp_grad_sync=res["uncompressed_dp_grad_sync"],
                                             compression="none"))
    return ctx.to_plan(best[1], best[2], report, search, uncompressed)


def _bound_search(ctx: "_Context", bounds: list, key: str, search: str, bar):
    """Price candidates in increasing lower bound until the bound exceeds the best `res[key]` found (all of them
    with search="exhaustive"). Returns (best (step, candidate, res) or None, evaluated, infeasible, leanest
    (need_bytes, candidate) of the infeasible ones or None)."""
    best, leanest, evaluated, infeasible = None, None, 0, 0
    for lb, cand in bounds:
        if search == "bound" and best is not None and lb > best[0]:
            break
        if bar is not None:
            bar.update(1)
        evaluated += 1
        res = ctx.evaluate(cand)
        if "step_s" not in res:
            infeasible += 1
            leanest = min(leanest or (math.inf, cand), (res["need_bytes"], cand))
        elif best is None or (res[key], cand) < (best[0], best[1]):
            best = (res[key], cand, res)
    return best, evaluated, infeasible, leanest


def _tuple(x) -> tuple[int, ...] | None:
    return None if x is None else (x,) if isinstance(x, int) else tuple(x)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _enumerate(ctx: "_Context", pps, tps, ms, schedules) -> tuple[list[Candidate], Counter, int]:
    """Valid candidates, exclusion reasons (counted), and the number enumerated."""
    for name in schedules:
        get_schedule(name)
    world, per_node, L = ctx.cluster.world_size, ctx.cluster.devices_per_node, ctx.segments.num_blocks
    for t in tps or ():
        if per_node % t:
            raise ValueError(f"tp={t} must divide devices_per_node={per_node}: tensor parallelism stays in a node")
    excluded: Counter = Counter()
    cands: list[Candidate] = []
    total = 0
    for t in tps or _divisors(per_node):
        for p in pps or _divisors(world // t):
            if world % (t * p):
                if pps and tps:  # both fixed by the caller: say so; otherwise skip this combination
                    raise ValueError(f"pp={p} x tp={t} does not divide the {world} devices of the cluster")
                excluded[f"pp x tp does not divide the {world} devices"] += 1
                continue
            d = world // (t * p)
            for m in ms or (_divisors(ctx.global_batch // d) if ctx.global_batch % d == 0 else (1,)):
                for name in schedules:
                    total += 1
                    if ctx.global_batch % (d * m):
                        excluded[f"global batch {ctx.global_batch} not divisible by dp x microbatches"] += 1
                    elif p == 1 and name != ("1f1b" if "1f1b" in schedules else schedules[0]):  # kept under a
                        excluded["pp=1: one schedule (1f1b = gradient accumulation) suffices"] += 1  # restriction too
                    elif (why := invalid_reason(name, p, m, L)) is not None:
                        excluded[why] += 1
                    else:
                        cands.append(Candidate(p, d, t, m, name))
    if not cands:
        if pps and tps and ms and len(pps) == len(tps) == len(ms) == 1:
            d = world // (tps[0] * pps[0])
            raise ValueError(f"global_batch={ctx.global_batch} does not split into dp={d} x microbatches={ms[0]} "
                             f"x an integer microbatch size. Remedy: a global batch divisible by {d * ms[0]}, or "
                             "another num_microbatches / pp / tp.")
        raise ValueError(f"no valid pipeline configuration; excluded: {dict(excluded)}")
    return cands, excluded, total


class _Context:
    """The fixed inputs of one search plus per-tp price caches (the only state; no globals)."""

    def __init__(self, traced, segments: Segments, cluster: Cluster, config: PlanConfig, budget: int,
                 global_batch: int, zero1: bool, partitioner: str) -> None:
        self.traced, self.segments, self.cluster, self.config = traced, segments, cluster, config
        self.budget, self.global_batch, self.zero1, self.partitioner = budget, global_batch, zero1, partitioner
        self.cache: dict[int, SegmentPrices] = {}
        self.reserve = 0  # bytes kept out of `budget` (`api.memory_budget`); set by plan_pipeline
        self.modes = RECOMPUTE_MODES if config.recompute == "auto" else (config.recompute,)
        self.codecs = codecs_of(config)  # data-parallel gradient codecs (`planner.compression`)
        self.evaluated: dict[Candidate, dict] = {}
        self.boundary_codecs = boundary.codecs_of(config.boundary_compression)  # stage-boundary codecs
        self.boundary_prices = boundary.price_codecs(traced, segments.cut_values, self.boundary_codecs,
                                                     config.boundary_rank, cluster.device)

    def prices(self, tp: int) -> SegmentPrices:
        if tp not in self.cache:
            self.cache[tp] = price_segments(self.traced, self.segments, tp, self.cluster, self.config)
        return self.cache[tp]

    def topology(self, c: Candidate) -> MeshTopology:
        return MeshTopology(self.cluster, (c.pp, c.dp, c.tp), AXES)

    def _scale(self, c: Candidate) -> float:
        return self.global_batch / (c.dp * c.num_microbatches) / self.segments.trace_batch

    def _state(self, pr: SegmentPrices, dp: int) -> np.ndarray:
        return pr.params_bytes + pr.grads_bytes + pr.optimizer_bytes / (dp if self.zero1 else 1)

    def lower_bound_s(self, c: Candidate, compressed: bool = True) -> float:
        """LB of the module docstring (sync term 0 when a codec may compress it and `compressed`)."""
        pr = self.prices(c.tp)
        f, b, w = pr.time_s(self._scale(c))
        sync = 0.0 if self.codecs and compressed else \
            collective_time_s("all_reduce", float(pr.grads_bytes.sum()) / c.pp, self.topology(c), ("dp",))
        return c.num_microbatches * float((f + b + w).sum()) / c.pp + sync

    def _p2p_s(self, nbytes: float, c: Candidate, topo: MeshTopology) -> float:
        if c.pp == 1 or nbytes == 0:
            return 0.0
        return (collective_time_s("send_recv", nbytes / c.tp, topo, ("pp",))
                + collective_time_s("all_gather", nbytes, topo, ("tp",)))

    def evaluate(self, c: Candidate) -> dict:
        """Price one candidate: {"step_s", ...} or {"need_bytes"} when it does not fit the memory budget.

        The DP partition (balanced, memory-aware) and the even split are both priced and the better feasible
        one kept: the DP is exact for v = 1, but for v > 1 a rank's time sums its chunks and the DP bounds
        chunk memory conservatively (budget / v each), and neither sees the dp gradient sync. Each stage
        takes the cheapest recomputation mode that fits (`partition.py`; `PlanConfig.recompute` other than
        "auto" allows only that mode). With boundary compression allowed (`planner.boundary`), the partition
        is priced again with each cut's codec chosen (`boundary.choose`); "auto" keeps the compressed result
        only when its step is >= `boundary.MIN_GAIN` faster, a forced codec always; the result then carries
        "boundary_compression" (`BoundaryCompression`, with the uncompressed price of the same stages).
        Results are cached per candidate."""
        if c not in self.evaluated:
            self.evaluated[c] = self._evaluate(c)
        return self.evaluated[c]

    def _evaluate(self, c: Candidate) -> dict:
        pr, seg, L = self.prices(c.tp), self.segments, self.segments.num_blocks
        v, p, m = get_schedule(c.schedule).virtual_stages, c.pp, c.num_microbatches
        scale, topo = self._scale(c), self.topology(c)
        f, b, w = pr.time_s(scale)
        state = self._state(pr, c.dp)
        t_by = {k: f + b + w + pr.rc_extra_lin[k] * scale for k in self.modes}
        act_by = {k: (pr.act_bytes + pr.rc_act_delta[k]) * scale for k in self.modes}
        rank = [rank_of_stage(c.schedule, s, p) for s in range(p * v)]
        inflight = [inflight_microbatches(c.schedule, p, m, r) for r in range(p)]
        # no partition fits when the average rank does not (state + the leanest mode's activations, each
        # kept for at least the fewest in-flight microbatches): skip the DP
        lean_act = np.minimum.reduce([act_by[k] for k in self.modes])
        need_lb = (float(state.sum()) + min(inflight) * float(lean_act.sum())) / p
        if need_lb > self.budget:
            return {"need_bytes": need_lb}
        p2p = {x: self._p2p_s(x * scale, c, topo) for x in set(seg.cut_fwd_bytes) | set(seg.cut_bwd_bytes)}
        cut_f, cut_b = tuple(p2p[x] for x in seg.cut_fwd_bytes), tuple(p2p[x] for x in seg.cut_bwd_bytes)
        plain = self._partitions(c, (f, b, w, state, t_by, act_by), cut_f, cut_b, rank, inflight, topo)
        if not self.boundary_codecs or c.pp == 1 or "step_s" not in plain:
            return plain
        codecs, comp_f, comp_b = boundary.choose(self.boundary_codecs, self.config.boundary_compression != "auto",
                                                 self.boundary_prices, lambda x: self._p2p_s(x, c, topo),
                                                 seg.cut_fwd_bytes, seg.cut_bwd_bytes, scale)
        comp = self._partitions(c, (f, b, w, state, t_by, act_by), comp_f, comp_b, rank, inflight, topo)
        if "step_s" not in comp or (self.config.boundary_compression == "auto"
                                    and comp["step_s"] * (1 + boundary.MIN_GAIN) > plain["step_s"]):
            return plain
        # the uncompressed price of the same stages, for the plan's speedup
        again = self._price_partition(c, comp["cuts"], comp["modes"], (f, b, w, state, act_by, cut_f, cut_b),
                                      rank, inflight, topo)
        choices = tuple(boundary.BoundaryChoice(
            s, codecs[j], 8 if codecs[j] == "int8" else None, self.config.boundary_rank if codecs[j] == "lowrank"
            else None, self.boundary_prices[codecs[j]].fwd_ratio[j] if codecs[j] != "none" else 1.0,
            comp_f[j] + comp_b[j], cut_f[j] + cut_b[j]) for s, j in enumerate(comp["cuts"][1:-1]))
        return dict(comp, boundary_compression=boundary.BoundaryCompression(
            self.config.boundary_compression, comp["step_s"], again["step_s"], self.config.boundary_rank, choices))

    def _partitions(self, c: Candidate, arrays, cut_f, cut_b, rank, inflight, topo) -> dict:
        """The better feasible of the DP partition and the even split for boundary transfer seconds
        cut_f / cut_b per cut (`evaluate`); {"need_bytes"} when neither fits."""
        f, b, w, state, t_by, act_by = arrays
        L, v, p = self.segments.num_blocks, get_schedule(c.schedule).virtual_stages, c.pp
        t0, a0 = t_by[self.modes[0]], act_by[self.modes[0]]
        chain = ChainCosts(tuple(t0[1:L + 1]), tuple(state[1:L + 1]), tuple(a0[1:L + 1]), float(t0[0]),
                           float(t0[L + 1]), float(state[0]), float(a0[0]), float(state[L + 1]),
                           float(a0[L + 1]), cut_f, cut_b, self.modes,
                           tuple(tuple(t_by[k][1:L + 1]) for k in self.modes),
                           tuple(tuple(act_by[k][1:L + 1]) for k in self.modes))
        limit = self.budget / v
        stage_inflight = tuple(inflight[r] for r in rank)
        options = {}
        if self.partitioner == "dp":
            part = partition_chain(chain, p * v, stage_inflight, limit)
            if part is not None:
                options[part.cuts] = ("dp", part.modes)
        cuts = uniform_partition(L, p * v)
        if cuts not in options:
            options[cuts] = ("uniform", tuple(chain.stage_mode(s, p * v, cuts[s], cuts[s + 1], stage_inflight[s], limit)
                                              for s in range(p * v)))
        results = []
        for cuts, (how, modes) in options.items():
            res = self._price_partition(c, cuts, tuple(self.modes[k] for k in modes),
                                        (f, b, w, state, act_by, cut_f, cut_b), rank, inflight, topo)
            results.append(dict(res, partition=how, cuts=cuts, modes=tuple(self.modes[k] for k in modes)))
        fits = [r for r in results if r["need_bytes"] <= self.budget]
        if not fits:
            return {"need_bytes": min(r["need_bytes"] for r in results)}
        return min(fits, key=lambda r: r["step_s"])

    def _price_partition(self, c: Candidate, cuts, modes, arrays, rank, inflight, topo) -> dict:
        """Stages, ranks, memory and step time of one partition, stage s in recomputation mode modes[s]
        (module docstring, step 3)."""
        pr, L = self.prices(c.tp), self.segments.num_blocks
        f, b, w, state, act_by, cut_f, cut_b = arrays
        S, p, m = len(cuts) - 1, c.pp, c.num_microbatches
        scale = self._scale(c)
        stages = []
        for s in range(S):
            i, j = cuts[s], cuts[s + 1]
            segs = ([0] if s == 0 else []) + list(range(i + 1, j + 1)) + ([L + 1] if s == S - 1 else [])
            bwd = float(b[segs].sum() + pr.rc_extra_lin[modes[s]][segs].sum() * scale) + (cut_b[i] if s > 0 else 0)
            stages.append(dict(segs=segs, blocks=(i, j - 1), fwd=float(f[segs].sum()) + (cut_f[j] if s < S - 1 else 0),
                               bwd=bwd, wgrad=float(w[segs].sum()), state=float(state[segs].sum()),
                               act=float(act_by[modes[s]][segs].sum()), rank=rank[s], recompute=modes[s]))
        ranks = []
        for r in range(p):
            mine = [s for s in range(S) if rank[s] == r]
            tot = {k: sum(stages[s][k] for s in mine) for k in ("fwd", "bwd", "wgrad", "state", "act")}
            grads = float(sum(pr.grads_bytes[stages[s]["segs"]].sum() for s in mine))
            ranks.append(dict(stages=tuple(mine), **tot, grads=grads, inflight=inflight[r],
                              memory=tot["state"] + inflight[r] * tot["act"]))
        hot = max(ranks, key=lambda r: r["fwd"] + r["bwd"] + r["wgrad"])
        pipe, bubble = pipeline_time_s(c.schedule, p, m, hot["fwd"], hot["bwd"], hot["wgrad"])
        sync = max(collective_time_s("all_reduce", r["grads"], topo, ("dp",)) for r in ranks)
        codec, codec_sync = self._compression(c, stages, ranks, topo)
        tied = 0.0
        if pr.shared_grad_bytes and rank[0] != rank[S - 1]:
            tied = collective_time_s("send_recv", pr.shared_grad_bytes, topo, ("pp",))
        chosen_sync = codec_sync.get(codec, sync)
        return dict(step_s=pipe + chosen_sync + tied, pipeline=pipe, bubble=bubble, dp_grad_sync=chosen_sync,
                    tied_grad_sync=tied, stages=stages, ranks=ranks, scale=self._scale(c),
                    need_bytes=max(r["memory"] for r in ranks), compression=codec,
                    uncompressed_step_s=pipe + sync + tied, uncompressed_dp_grad_sync=sync)

    def _compression(self, c: Candidate, stages: list[dict], ranks: list[dict], topo: MeshTopology
                     ) -> tuple[str, dict[str, float]]:
        """(chosen codec, codec -> seconds of the dp sync with it) for one partition (module docstring, step 3):
        per codec the slowest rank's compressed all-reduces + codec compute; "auto" compares them with the
        uncompressed sync minus what can hide under the rank's backward (m microbatches of B + W)."""
        if c.dp == 1 or not self.codecs:
            return "none", {}
        pr, device, m = self.prices(c.tp), self.cluster.device, c.num_microbatches
        grads = [[g for s in r["stages"] for seg in stages[s]["segs"] for g in pr.grad_shapes[seg]] for r in ranks]
        costs = {}
        for codec in self.codecs:
            costs[codec] = max(sum(compressed_sync_time_s(
                compressed_sync(codec, [shape for shape, _ in g], g[0][1] if g else 4, self.config.powersgd_rank),
                topo, ("dp",), device)) for g in grads)
        floor = max(max(0.0, collective_time_s("all_reduce", r["grads"], topo, ("dp",))
                        - device.comm_overlap * m * (r["bwd"] + r["wgrad"])) for r in ranks)
        return choose(self.config.compression, floor, costs), costs

    def to_plan(self, c: Candidate, res: dict, report: SearchReport, search: str,
                uncompressed_step_s: float) -> PipelinePlan:
        pr, seg, L = self.prices(c.tp), self.segments, self.segments.num_blocks
        sched = get_schedule(c.schedule)
        per_stage = c.dp * c.tp
        stages = tuple(StageSpec(
            s, st["rank"], st["blocks"][0], st["blocks"][1], 0 in st["segs"], L + 1 in st["segs"],
            tuple(range(st["rank"] * per_stage, (st["rank"] + 1) * per_stage)),
            tuple(dict.fromkeys(n for k in st["segs"] for n in seg.nodes[k])),
            st["fwd"], st["bwd"], st["wgrad"], int(st["state"]), int(st["act"]), st["recompute"])
            for s, st in enumerate(res["stages"]))
        ranks = tuple(RankCost(r, rc["stages"], rc["fwd"] + rc["bwd"] + rc["wgrad"], rc["inflight"], int(rc["memory"]))
                      for r, rc in enumerate(res["ranks"]))
        world = self.cluster.world_size
        fwd_flops, bwd_flops = graph_flops(self.traced.graph_module)
        flops = int((fwd_flops + bwd_flops) * self.global_batch / seg.trace_batch)
        dtype = max(self.traced.parameters.values(), key=lambda q: q.numel).dtype
        peak = float(self.cluster.device.peak_flops_per_s[dtype])
        step = res["step_s"]
        s = pr.plan.solver
        return PipelinePlan(
            mesh=MeshSpec(AXES, (c.pp, c.dp, c.tp)), schedule=c.schedule, torch_schedule=sched.torch_class,
            virtual_stages=sched.virtual_stages, global_batch=self.global_batch, num_microbatches=c.num_microbatches,
            microbatch_size=self.global_batch // (c.dp * c.num_microbatches), trace_batch=seg.trace_batch,
            stages=stages, ranks=ranks, bubble_fraction=bubble_fraction(res["pipeline"], res["bubble"]),
            bubble_ratio=bubble_ratio(res["pipeline"], res["bubble"]), step_time_s=step,
            step_breakdown_s={k: res[k] for k in ("pipeline", "bubble", "dp_grad_sync", "tied_grad_sync")},
            flops_per_step=flops, tflops_per_gpu=flops / step / world / 1e12, mfu=flops / step / world / peak,
            peak_flops_per_s=peak, device=self.cluster.device.name,
            stage_kinds=self._kinds(stages, res, pr), block_group=seg.group, partition=res["partition"],
            intra_stage_solver={"mesh": str(pr.plan.mesh), "solver": s.solver, "status": s.status,
                                "optimal": s.optimal, "objective_s_at_trace_batch": s.objective_s,
                                "num_groups": s.num_groups, "num_variables": s.num_variables},
            search=report,
            config={"memory_budget_bytes": self.budget + self.reserve, "memory_reserve_bytes": self.reserve,
                    "recompute": self.config.recompute, "zero1": self.zero1, "search": search,
                    "partitioner": self.partitioner, "optimizer": self.config.optimizer,
                    "precision": resolve_precision(self.config.precision, self.cluster.device,
                                                   traced_in_low_precision(self.traced)), "cluster": {
                        "nodes": self.cluster.num_nodes, "devices_per_node": self.cluster.devices_per_node}},
            compression=make_record(self.config, res["compression"], step, uncompressed_step_s),
            intra_stage_plan=pr.plan, boundary_compression=res.get("boundary_compression"))

    def _kinds(self, stages: tuple[StageSpec, ...], res: dict, pr: SegmentPrices) -> tuple[StageKindSummary, ...]:
        """One summary per distinct stage kind: compute and collectives per microbatch, memory at peak."""
        by_kind: dict[str, list[int]] = {}
        for st in stages:
            by_kind.setdefault(st.kind, []).append(st.index)
        out = []
        for kind, idx in by_kind.items():
            st, segs = res["stages"][idx[0]], res["stages"][idx[0]]["segs"]
            comm = {k: float(pr.comm_lin_s[k][segs].sum() * res["scale"] + pr.comm_fixed_s[k][segs].sum())
                    for k in COMM_KINDS}
            total = float((pr.fwd_lin[segs].sum() + pr.bwd_lin[segs].sum() + pr.rc_extra_lin[st["recompute"]][segs].sum())
                          * res["scale"] + pr.fwd_fixed[segs].sum() + pr.bwd_fixed[segs].sum())
            mem = {"params": int(pr.params_bytes[segs].sum()), "grads": int(pr.grads_bytes[segs].sum())}
            mem["optimizer"] = int(st["state"]) - mem["params"] - mem["grads"]
            mem["activations"] = int(st["act"] * res["ranks"][st["rank"]]["inflight"])
            mem["total"] = sum(mem.values())
            out.append(StageKindSummary(kind, tuple(idx), total - sum(comm.values()), comm, mem))
        return tuple(out)
