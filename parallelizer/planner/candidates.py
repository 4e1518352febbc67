"""The candidate evaluation of the pipeline search (`planner.search`, whose module docstring states the method):
a point of the search space (`Candidate`) and `_Context`, the fixed inputs of one search with its per-tp price
caches, which prices a candidate's partitions (`evaluate`: the partition DP and the even split, each stage's
(layout, recomputation) pair, boundary and gradient compression, a lower bound per partition), simulates one
(`exact`) and turns the best into a `PipelinePlan` (`to_plan`). Split from `search.py` (round 16) with no
change of behaviour; `search` holds the outer loop (enumeration, branch and bound).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cost_model.communication import collective_time_s
from cost_model.compression import compressed_sync, compressed_sync_time_s
from cost_model.compute import graph_flops, optimizer_step_time_s
from cost_model.memory import bytes_per_param
from cost_model.pipeline_actions import copy_exchange_pack_s
from cost_model.topology import Cluster, MeshTopology

from ..config import PlanConfig
from ..core.mesh import MeshSpec
from . import boundary
from .compression import choose, codecs_of, make_record
from .costs import GraphTables, mfu_dtype, resolve_precision, traced_in_low_precision
from .partition import ChainCosts, partition_chain, uniform_partition
from .recompute import RECOMPUTE_MODES
from .pipeline import PipelinePlan, RankCost, SearchReport, StageKindSummary, StageSpec
from .schedules import (V_PLACED, bubble_fraction, bubble_ratio, copies, get_schedule, inflight_microbatches,
                        ranks_of_stage)
from .sharing import SharedCores, pipeline_cores
from .simulate import POSTS_RECEIVES_AT_START, StageTimes, compile_schedule, peak_held_bytes, simulate
from .stage_sync import exposed_lb, stage_syncs, sync_cpu_s, sync_times
from .segments import COMM_KINDS, SegmentPrices, Segments, price_segments

AXES = ("pp", "dp", "tp")


@dataclass(frozen=True, slots=True, order=True)
class Candidate:
    """One point of the search space; ordering = the deterministic tie-break."""

    pp: int
    dp: int
    tp: int
    num_microbatches: int
    schedule: str



class _Context:
    """The fixed inputs of one search plus per-tp price caches (the only state; no globals)."""

    def __init__(self, traced, segments: Segments, cluster: Cluster, config: PlanConfig, budget: int,
                 global_batch: int, zero1: bool, partitioner: str, tables: GraphTables | None = None) -> None:
        self.traced, self.segments, self.cluster, self.config = traced, segments, cluster, config
        self.budget, self.global_batch, self.zero1, self.partitioner = budget, global_batch, zero1, partitioner
        self.cache: dict[int, SegmentPrices] = {}
        self.lean_cache: dict[int, SegmentPrices] = {}  # tp -> the memory-lean layout's prices (`prices`)
        from ..runtime.stage_cut import step_returned_share  # runtime imports the planner: at call time
        self.returned_share = step_returned_share(traced)  # of the returned bytes, what the last stage returns
        self.built: dict[int, tuple] = {}  # tp -> the intra-stage ILP's (problem, pricer), for both layouts
        self.tables = tables or GraphTables()  # the traced graph's facts, shared by the per-tp solves
        self.reserve = 0  # bytes kept out of `budget` (`api.memory_budget`); set by plan_pipeline
        self.overlap_grad_sync = True  # plan_pipeline's argument; the fraction of a dp sync that can hide:
        self.sync_overlap = cluster.device.comm_overlap
        self.refused: dict[str, str] = {}  # schedule -> why the model rules it out (`_enumerate`)
        self.modes = RECOMPUTE_MODES if config.recompute == "auto" else (config.recompute,)
        self.codecs = codecs_of(config)  # data-parallel gradient codecs (`planner.compression`)
        self.evaluated: dict[Candidate, list[dict]] = {}
        self.boundary_codecs = boundary.codecs_of(config.boundary_compression)  # stage-boundary codecs
        self.boundary_prices = boundary.price_codecs(traced, segments.cut_values, self.boundary_codecs,
                                                     config.boundary_rank, cluster.device)
        self.shared: dict[tuple[int, int, int], tuple[SharedCores | None, float]] = {}

    def sharing(self, c: Candidate) -> tuple[SharedCores | None, float]:
        """(cores, scale) of candidate c's simulation (module docstring, "Ranks sharing cores"): without
        `Cluster.sharing` (every GPU preset) (None, 1.0); else `sharing.pipeline_cores`, cached per mesh."""
        key = (c.pp, c.dp, c.tp)
        if key not in self.shared:
            share = self.cluster.sharing
            self.shared[key] = (None, 1.0) if share is None else pipeline_cores(share, *key)
        return self.shared[key]

    def prices(self, tp: int, lean: bool = False) -> SegmentPrices:
        """Per-segment prices on tp devices of the time-optimal intra-stage layout, or (`lean`) of the
        memory-lean one (`ilp.solve_lean`), each solved once per tp."""
        cache = self.lean_cache if lean else self.cache
        if tp not in cache:
            cache[tp] = price_segments(self.traced, self.segments, tp, self.cluster, self.config, self.tables, lean,
                                       self.built)
        return cache[tp]

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
        shared = self.sharing(c)[1]
        sync = 0.0
        if not (self.codecs and compressed):
            whole = collective_time_s("all_reduce", float(pr.grads_bytes.sum()) / c.pp, self.topology(c), ("dp",))
            sync = (1 - self.sync_overlap) * whole  # at most the fraction o of a sync hides (a lean stage's
            # backward, which the sync may overlap, can be longer than this layout's: no window term here)
        return c.num_microbatches * float((f + b + w).sum()) * shared / c.pp + sync

    def _one_window(self, c: Candidate) -> bool:
        """Whether every rank of c holds one stage and runs alone on its device: then the window its stage syncs
        overlap (that stage's last backward) lasts at most one microbatch's B (= I + W) seconds."""
        return (get_schedule(c.schedule).virtual_stages == 1 and copies(c.schedule) == 1
                and self.sharing(c)[0] is None)

    def _p2p_s(self, nbytes: float, c: Candidate, topo: MeshTopology) -> float:
        if c.pp == 1 or nbytes == 0:
            return 0.0
        return (collective_time_s("send_recv", nbytes / c.tp, topo, ("pp",))
                + collective_time_s("all_gather", nbytes, topo, ("tp",)))

    def evaluate(self, c: Candidate) -> list[dict]:
        """Price one candidate's partitions by their lower bound: the fitting ones ({"step_lb", ...}, to be
        simulated by `exact`), or [{"need_bytes"}] (the smallest need) when none fits the memory budget.

        The DP partition (balanced, memory-aware) and the even split are both priced and the better feasible
        one kept: the DP is exact for v = 1, but for v > 1 a rank's time sums its chunks and the DP bounds
        chunk memory conservatively (budget / v each), and neither sees the dp gradient sync. Each stage
        takes the cheapest recomputation mode that fits (`partition.py`; `PlanConfig.recompute` other than
        "auto" allows only that mode). With boundary compression allowed (`planner.boundary`), the partitions
        are priced again with each cut's codec chosen (`boundary.choose`), each carrying the uncompressed
        price of its own stages ("boundary"); `exact` keeps the compressed one under "auto" only when its
        simulated step is >= `boundary.MIN_GAIN` faster, a forced codec always. Results are cached per
        candidate."""
        if c not in self.evaluated:
            self.evaluated[c] = self._evaluate(c)
        return self.evaluated[c]

    def _evaluate(self, c: Candidate) -> list[dict]:
        """`evaluate` with the time-optimal stage layout; where memory binds on a tp > 1 mesh (no partition
        fits, a stage recomputes, or the balanced cut is not the one without a memory limit) again with each
        stage free to take the memory-lean layout instead (`ilp.solve_lean`, priced once per tp only then):
        a mode of the partition DP is then a (layout, recomputation) pair (`partition.py`). Where memory does
        not bind the time-optimal layout's partition is the best one, so the lean layout is not priced."""
        if c.tp in self.lean_cache:  # priced already: one DP over both layouts (the same result where memory
            return self._evaluate_layouts(c, (False, True))[0]  # does not bind: the fastest mode everywhere)
        plain, binds = self._evaluate_layouts(c, (False,))
        if c.tp == 1 or not binds:
            return plain
        return self._evaluate_layouts(c, (False, True))[0]

    def _evaluate_layouts(self, c: Candidate, layouts: tuple[bool, ...]) -> tuple[list[dict], bool]:
        """(`evaluate`'s results with stages free to take any of `layouts` (False: time-optimal, True: lean),
        whether memory binds: see `_evaluate`)."""
        seg, L = self.segments, self.segments.num_blocks
        v, p, m = get_schedule(c.schedule).virtual_stages, c.pp, c.num_microbatches
        scale, topo = self._scale(c), self.topology(c)
        by_layout, t_by, act_by = {}, {}, {}
        for lean in layouts:
            pr = self.prices(c.tp, lean)
            f, b, w = pr.time_s(scale)
            by_layout[lean] = (f, b, w, self._state(pr, c.dp))
            for k in self.modes:
                t_by[(lean, k)] = f + b + w + pr.rc_extra_lin[k] * scale
                act_by[(lean, k)] = (pr.act_bytes + pr.rc_act_delta[k]) * scale
        # modes of the partition DP: fastest per block first (`partition.py`); ties keep (layout, mode) order;
        # a mode no faster than an earlier one that holds no more bytes anywhere can never be chosen: dropped
        order = sorted(t_by, key=lambda k: float(t_by[k][1:L + 1].sum()))
        state_of = {k: by_layout[k[0]][3] for k in order}
        modes = tuple(k for i, k in enumerate(order) if not any(
            (state_of[j] <= state_of[k]).all() and (act_by[j] <= act_by[k]).all() and (t_by[j] <= t_by[k]).all()
            for j in order[:i]))
        rank = [ranks_of_stage(c.schedule, s, p) for s in range(p * v)]  # per copy (bitpipe holds 2)
        held = copies(c.schedule)
        inflight = [inflight_microbatches(c.schedule, p, m, r) for r in range(p)]
        # no partition fits when the average rank does not (state + the leanest mode's activations, each
        # kept for at least the fewest in-flight microbatches): skip the DP
        need_lb = min(held * (float(by_layout[lean][3].sum()) + min(inflight) * float(np.minimum.reduce(
            [act_by[(lean, k)] for k in self.modes]).sum())) / p for lean in layouts)
        if need_lb > self.budget:
            return [{"need_bytes": need_lb}], True
        p2p = {x: self._p2p_s(x * scale, c, topo) for x in set(seg.cut_fwd_bytes) | set(seg.cut_bwd_bytes)}
        cut_f, cut_b = tuple(p2p[x] for x in seg.cut_fwd_bytes), tuple(p2p[x] for x in seg.cut_bwd_bytes)
        arrays = (by_layout, t_by, act_by, modes)
        plain, binds = self._partitions(c, arrays, cut_f, cut_b, rank, inflight, held, topo)
        if not self.boundary_codecs or c.pp == 1 or "step_lb" not in plain[0]:
            return plain, binds
        codecs, comp_f, comp_b = boundary.choose(self.boundary_codecs, self.config.boundary_compression != "auto",
                                                 self.boundary_prices, lambda x: self._p2p_s(x, c, topo),
                                                 seg.cut_fwd_bytes, seg.cut_bwd_bytes, scale)
        comp, _ = self._partitions(c, arrays, comp_f, comp_b, rank, inflight, held, topo)
        if "step_lb" not in comp[0]:
            return plain, binds
        for res in comp:  # the uncompressed price of the same stages, and what each boundary sends
            again = self._price_partition(c, res["cuts"], res["modes"], (by_layout, act_by, cut_f, cut_b),
                                          rank, inflight, topo)
            choices = tuple(boundary.BoundaryChoice(
                k, codecs[j], 8 if codecs[j] == "int8" else None,
                self.config.boundary_rank if codecs[j] == "lowrank" else None,
                self.boundary_prices[codecs[j]].fwd_ratio[j] if codecs[j] != "none" else 1.0,
                comp_f[j] + comp_b[j], cut_f[j] + cut_b[j]) for k, j in enumerate(res["cuts"][1:-1]))
            res["boundary"] = (dict(again, partition=res["partition"], cuts=res["cuts"], modes=res["modes"]),
                               choices)
        return (comp if self.config.boundary_compression != "auto" else plain + comp), binds

    def _partitions(self, c: Candidate, arrays, cut_f, cut_b, rank, inflight, held: int, topo
                    ) -> tuple[list[dict], bool]:
        """The DP partition and the even split of one candidate for boundary transfer seconds cut_f / cut_b
        per cut (`evaluate`), each priced by `_price_partition`: (the fitting ones, or [{"need_bytes"}];
        whether memory binds: none fits, a stage takes a mode other than the fastest, or the DP's cut is
        slower than the one without a memory limit). A mode is a (lean layout?, recomputation) pair."""
        by_layout, t_by, act_by, modes = arrays
        L, v, p = self.segments.num_blocks, get_schedule(c.schedule).virtual_stages, c.pp
        state_by = {k: by_layout[k[0]][3] for k in modes}
        ends = tuple((float(t_by[k][0]), float(t_by[k][L + 1]), float(state_by[k][0]), float(act_by[k][0]),
                      float(state_by[k][L + 1]), float(act_by[k][L + 1])) for k in modes)
        t0, a0, s0 = t_by[modes[0]], act_by[modes[0]], state_by[modes[0]]
        chain = ChainCosts(tuple(t0[1:L + 1]), tuple(s0[1:L + 1]), tuple(a0[1:L + 1]), *ends[0][:2],
                           ends[0][2], ends[0][3], ends[0][4], ends[0][5], cut_f, cut_b,
                           tuple(("lean:" if lean else "") + k for lean, k in modes),
                           tuple(tuple(t_by[k][1:L + 1]) for k in modes),
                           tuple(tuple(act_by[k][1:L + 1]) for k in modes),
                           tuple(tuple(state_by[k][1:L + 1]) for k in modes), ends)
        limit = self.budget / (v * held)
        stage_inflight = tuple(inflight[r[0]] for r in rank)
        options = {}
        binds = False
        if self.partitioner == "dp":
            part = partition_chain(chain, p * v, stage_inflight, limit)
            if part is not None:
                options[part.cuts] = ("dp", part.modes)
                if not any(part.modes):  # every stage in the fastest mode: is the cut the unlimited one?
                    free = partition_chain(chain, p * v, stage_inflight)
                    binds = free is not None and free.max_stage_s < part.max_stage_s
        cuts = uniform_partition(L, p * v)
        if cuts not in options:
            options[cuts] = ("uniform", tuple(chain.stage_mode(s, p * v, cuts[s], cuts[s + 1], stage_inflight[s], limit)
                                              for s in range(p * v)))
        results = []
        for cuts, (how, chosen) in options.items():
            named = tuple(modes[k] for k in chosen)
            res = self._price_partition(c, cuts, named, (by_layout, act_by, cut_f, cut_b), rank, inflight, topo)
            results.append(dict(res, partition=how, cuts=cuts, modes=named))
        fits = [r for r in results if r["need_bytes"] <= self.budget]
        binds = binds or not fits or any(k != modes[0] for r in fits for k in r["modes"])
        return fits or [{"need_bytes": min(r["need_bytes"] for r in results)}], binds

    def _price_partition(self, c: Candidate, cuts, modes, arrays, rank, inflight, topo) -> dict:
        """Stages, ranks, memory (closed-form in-flight counts, equal to the simulated ones: tested; BitPipe's with
        the receive buffers its runner posts at the step's start, by the simulator's `peak_held_bytes`) and a
        lower bound on the step time of one partition, stage s in recomputation mode modes[s] (module
        docstring, step 3). Bound: rank r starts no earlier than microbatch 0's forward chain reaches its
        first stage (head) and then computes m x its per-microbatch seconds (busy); with full backwards
        (no B/W split), its last backward, on its first stage, is followed by the backward chain below it
        (tail); its gradient all-reduce delays its end by at least (1 - o) sync + o max(0, sync - W) (`stage_sync.exposed_lb`;
        o the hidden fraction, W its one stage's B when it holds one stage alone on its device, else
        unbounded): step >= max_r head + busy + max(tail, that + ZeRO-1's broadcast) + the tied exchange.
        `exact` simulates the partition's action list. modes[s] = (lean layout?, recomputation mode) of stage
        s (`_partitions`)."""
        L = self.segments.num_blocks
        by_layout, act_by, cut_f, cut_b = arrays
        S, p, m = len(cuts) - 1, c.pp, c.num_microbatches
        scale, shared = self._scale(c), self.sharing(c)[1]  # shared: compute seconds -> simulated (sharing)
        stages = []
        for s in range(S):
            i, j = cuts[s], cuts[s + 1]
            lean, rc = modes[s]
            pr = self.prices(c.tp, lean)
            f, b, w, state = by_layout[lean]
            segs = ([0] if s == 0 else []) + list(range(i + 1, j + 1)) + ([L + 1] if s == S - 1 else [])
            f_c = float(f[segs].sum())
            b_c = float(b[segs].sum() + pr.rc_extra_lin[rc][segs].sum() * scale)
            stages.append(dict(segs=segs, blocks=(i, j - 1), fwd=f_c + (cut_f[j] if s < S - 1 else 0),
                               bwd=b_c + (cut_b[i] if s > 0 else 0), wgrad=float(w[segs].sum()),
                               fwd_c=f_c, bwd_c=b_c, state=float(state[segs].sum()),
                               act=float(act_by[modes[s]][segs].sum()), rank=rank[s][0], recompute=rc, lean=lean,
                               grads=float(pr.grads_bytes[segs].sum()), params=float(pr.params_bytes[segs].sum()),
                               # per segment in backward order: (its seconds in the stage's last backward action,
                               # the gradient bytes it produces) (`stage_sync.stage_syncs`); a split
                               # schedule's last action is the W, which produces the weight gradients
                               produced=[(float(w[q]) if c.schedule in V_PLACED else
                                          float(b[q] + w[q] + pr.rc_extra_lin[rc][q] * scale),
                                          float(pr.grads_bytes[q])) for q in reversed(segs)]))
        # transfers: the simulator charges them across ranks only; the bound and the byte count likewise
        p2p_f, p2p_b = [cut_f[cuts[s + 1]] for s in range(S - 1)], [cut_b[cuts[s + 1]] for s in range(S - 1)]
        held = len(rank[0])
        cross = [[rank[s][k] != rank[s + 1][k] for s in range(S - 1)] for k in range(held)]
        ranks, bounds = [], []
        split = c.schedule in V_PLACED  # backward split into I and W: no tail bound
        syncs, ready = stage_syncs(c.dp, [st["grads"] for st in stages], topo, self.overlap_grad_sync,
                                   [st["produced"] for st in stages])
        # the last stage returns the model's outputs a step reads (`runtime.stage_cut.step_returns`: its own loss
        # alone, when it has one) of each microbatch whole over dp and tp, so its ranks hold one microbatch of them
        out_bytes = self.prices(c.tp).plan.cost.memory_bytes.get("outputs", 0) * scale * c.dp * self.returned_share
        for r in range(p):
            mine = [s for s in range(S) if r in rank[s]]  # model stages r holds (bitpipe: of both copies)
            tot = {k: sum(stages[s][k] for s in mine) for k in ("fwd", "bwd", "wgrad", "state", "act")}
            grads = sum(stages[s]["grads"] for s in mine)
            sync, after = sum(sum(syncs[s]) for s in mine), 0.0
            if self.config.zero1 == "dp":  # torch's ZeroRedundancyOptimizer runs it: it broadcasts the stepped
                # parameters after the all-reduce (an all-gather's bytes more than the distributed optimizer's)
                params = sum(stages[s]["params"] for s in mine)
                after = collective_time_s("all_gather", params, topo, ("dp",))
            window = sum(stages[s]["bwd_c"] + stages[s]["wgrad"] for s in mine) * shared \
                if self._one_window(c) else math.inf  # the simulated B of its one stage
            heads, tails = [], []
            for k in range(held):
                first = min((s for s in range(S) if rank[s][k] == r), default=None)
                if first is not None:
                    heads.append(sum(stages[s]["fwd_c"] * shared + p2p_f[s] * cross[k][s] for s in range(first)))
                    tails.append(sum((stages[s]["bwd_c"] + stages[s]["wgrad"]) * shared + p2p_b[s] * cross[k][s]
                                     for s in range(first)))
            tail = 0.0 if split or held > 1 else tails[0]
            busy = m / held * sum(stages[s]["fwd_c"] + stages[s]["bwd_c"] + stages[s]["wgrad"]
                                  for s in mine) * shared
            bounds.append((min(heads) + busy, tail))
            held_out = out_bytes if S - 1 in mine else 0.0
            ranks.append(dict(stages=tuple(mine), **tot, grads=grads, sync=sync, after=after, window=window,
                              outputs=held_out, inflight=inflight[r],
                              memory=tot["state"] + held_out + inflight[r] * tot["act"]))
        if c.schedule in POSTS_RECEIVES_AT_START and max(r["memory"] for r in ranks) <= self.budget:  # (buffers only
            # add) its runner holds the step's receive buffers from its start: the simulator's rule
            # (`simulate.peak_held_bytes`), so the first pass prices the memory the exact one does
            peaks = peak_held_bytes(compile_schedule(c.schedule, p, m), [st["act"] for st in stages],
                                    *self._cut_bytes(c, cuts[1:-1]))
            for rc, peak in zip(ranks, peaks):
                rc["memory"] = rc["state"] + rc["outputs"] + peak
        codec, codec_sync = self._compression(c, stages, ranks, topo)
        for r, rc in enumerate(ranks):  # the sync each rank runs: the chosen codec's, or the plain all-reduce
            rc["plain_sync"] = rc["sync"]
            rc["sync"] = codec_sync[codec][r] if codec != "none" else rc["sync"]
        # a valid bound for both passes (`_bound_search`): each rank's cheaper exposed sync (PowerSGD's in full)
        lb = max(head_busy + max(tail, rc["after"] + min(
            rc["sync"] if codec == "powersgd" else exposed_lb(rc["sync"], rc["window"], self.sync_overlap),
            exposed_lb(rc["plain_sync"], rc["window"], self.sync_overlap))) for (head_busy, tail), rc in zip(bounds, ranks))
        tied = 0.0
        shared_grads = self.prices(c.tp, stages[0]["lean"]).shared_grad_bytes  # the first stage's copy
        if shared_grads and any(rank[0][k] != rank[S - 1][k] for k in range(held)):
            tied = collective_time_s("send_recv", shared_grads, topo, ("pp",))
        seg = self.segments
        sent = [0.0] * p  # bytes each device sends per step: activations out of its stages, gradients back
        for k in range(held):
            for s in range(S - 1):
                if cross[k][s]:
                    sent[rank[s][k]] += seg.cut_fwd_bytes[cuts[s + 1]]
                    sent[rank[s + 1][k]] += seg.cut_bwd_bytes[cuts[s + 1]]
        p2p_bytes = m / held * scale * max(sent) / c.tp
        # BitPipe: the two copies of a stage exchange gradients (Wu et al. Sec. 3: eager, overlapping compute)
        copy_sync = tuple(collective_time_s("send_recv", st["grads"], topo, ("pp",))
                          for st in stages) if held > 1 else None
        # ... and each copy's rank packs / sums that exchange on the host (round 18: memory passes, CPU work)
        copy_pack = tuple(copy_exchange_pack_s(st["grads"], self.cluster.device)
                          for st in stages) if held > 1 else None
        return dict(step_lb=lb + tied, tied_grad_sync=tied, stages=stages, ranks=ranks, scale=scale,
                    stage_sync=(syncs, ready),
                    p2p=(tuple(p2p_f), tuple(p2p_b)), p2p_bytes=p2p_bytes, copy_sync=copy_sync, copy_pack=copy_pack,
                    need_bytes=max(r["memory"] for r in ranks), compression=codec)

    def _compression(self, c: Candidate, stages: list[dict], ranks: list[dict], topo: MeshTopology
                     ) -> tuple[str, dict[str, list[float]]]:
        """(chosen codec, codec -> per-rank seconds of the dp sync with it) for one partition (module
        docstring, step 3): per codec a rank's compressed all-reduces + codec compute; "auto" compares the
        slowest rank's with the uncompressed sync minus what can hide under the rank's backward (m
        microbatches of B + W)."""
        if c.dp == 1 or not self.codecs:
            return "none", {}
        device, m = self.cluster.device, c.num_microbatches
        grads = [[g for s in r["stages"] for seg in stages[s]["segs"]
                  for g in self.prices(c.tp, stages[s]["lean"]).grad_shapes[seg]] for r in ranks]
        per_rank = {codec: [sum(compressed_sync_time_s(
            compressed_sync(codec, [shape for shape, _ in g], g[0][1] if g else 4, self.config.powersgd_rank),
            topo, ("dp",), device)) for g in grads] for codec in self.codecs}
        floor = max(max(0.0, r["sync"] - device.comm_overlap * m * (r["bwd"] + r["wgrad"])) for r in ranks)
        return choose(self.config.compression, floor, {k: max(v) for k, v in per_rank.items()}), per_rank

    def exact(self, c: Candidate, res: dict) -> dict:
        """Simulate a partition priced by `_price_partition` (`planner.simulate`: the schedule's own action
        list): step = the last rank's end including its dp gradient all-reduce, + the tied exchange;
        memory with the simulated peak in-flight activation bytes per rank. Returns res with "step_s",
        "pipeline" (compute makespan), "bubble", "dp_grad_sync" (the exposed part), or {"need_bytes"} when
        the simulated memory exceeds the budget."""
        out = self._simulate(c, res)
        if "boundary" not in res or "step_s" not in out:
            return out
        again, choices = res["boundary"]  # the same stages without boundary compression
        plain = self._simulate(c, again)
        if (self.config.boundary_compression == "auto" and "step_s" in plain
                and out["step_s"] * (1 + boundary.MIN_GAIN) > plain["step_s"]):
            return plain
        return dict(out, boundary_compression=boundary.BoundaryCompression(
            self.config.boundary_compression, out["step_s"], plain.get("step_s", math.inf), self.config.boundary_rank,
            choices))

    def _simulate(self, c: Candidate, res: dict) -> dict:
        """`exact` for one priced partition: its simulated step with the chosen dp sync ("step_s") and with
        the uncompressed one ("uncompressed_step_s"; equal when no gradient codec is chosen)."""
        st, ranks = res["stages"], res["ranks"]
        cores, shared = self.sharing(c)  # (None, 1.0) on a GPU cluster: the prices as they are

        seg = self.segments  # sizes for the per-byte / per-node / per-op CPU (simulate)
        ops = np.bincount(list(seg.owner.values()), minlength=seg.num_blocks + 2)
        cut = [s["blocks"][1] + 1 for s in st[:-1]]
        fwd_bytes, bwd_bytes = self._cut_bytes(c, cut)
        sizes = dict(p2p_bytes=fwd_bytes, p2p_bwd_bytes=bwd_bytes,
                     p2p_ops=tuple(float(max(1, len(seg.cut_values[j]))) for j in cut) if seg.cut_values else None,
                     backward_nodes=tuple(float(sum(ops[g] + len(self.prices(c.tp, s["lean"]).grad_shapes[g])
                                                    for g in s["segs"])) for s in st),
                     weight_grad_bytes=tuple(s["grads"] for s in st))

        host, after = self._host_cpu(c, st, ranks, shared) if cores is not None else (None, 0.0)

        def run(codec):
            return simulate(c.schedule, c.pp, c.num_microbatches, StageTimes(
                tuple(s["fwd_c"] * shared for s in st), tuple(s["bwd_c"] * shared for s in st),
                tuple(s["wgrad"] * shared for s in st), res["p2p"][0], res["p2p"][1], tuple(s["act"] for s in st),
                res["copy_sync"], **sync_times(res, codec, self.sync_overlap),
                action_overhead=self.cluster.device.pipeline_action.scaled(shared),  # per action (simulate)
                copy_pack_s=None if res["copy_pack"] is None else tuple(x * shared for x in res["copy_pack"]),
                host_cpu_s=host, **sizes), cores)

        def step(sim):  # round 21: no step beats the ranks' CPU over the cores; the optimizer, in that floor, is
            return max(sim.makespan_s, sim.cpu_floor_s - after)  # added after the step (`steptime`): not twice

        sim = run(res["compression"])
        plain = sim if res["compression"] == "none" else run("none")
        ranks = [dict(r, inflight=sim.inflight_microbatches[k],
                      memory=r["state"] + r["outputs"] + sim.peak_inflight_bytes[k])
                 for k, r in enumerate(ranks)]
        need = max(r["memory"] for r in ranks)
        if need > self.budget:
            return {"need_bytes": need}
        tied = res["tied_grad_sync"]
        return dict(res, ranks=ranks, need_bytes=need, step_s=step(sim) + tied,
                    pipeline=sim.compute_end_s, bubble=sim.bubble_s, dp_grad_sync=sim.makespan_s - sim.compute_end_s,
                    rank_bubble=sim.bubble_fraction, uncompressed_step_s=step(plain) + tied,
                    uncompressed_dp_grad_sync=plain.makespan_s - plain.compute_end_s)

    def _cut_bytes(self, c: Candidate, cut) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(activation, gradient) bytes one device sends across each stage boundary per microbatch, for the cuts
        `cut` (the block index after each stage but the last): the segments' cut bytes at the candidate's
        microbatch scale, a tp-th each (`simulate.StageTimes.p2p_bytes` / `p2p_bwd_bytes`)."""
        seg, scale = self.segments, self._scale(c)
        return (tuple(seg.cut_fwd_bytes[j] * scale / c.tp for j in cut),
                tuple(seg.cut_bwd_bytes[j] * scale / c.tp for j in cut))

    def _host_cpu(self, c: Candidate, st: list[dict], ranks: list[dict], shared: float
                  ) -> tuple[tuple[float, ...], float]:
        """(per pipeline rank, the solo CPU seconds outside its simulated actions: its stages' dp-sync CPU
        (`stage_sync.sync_cpu_s`) + its optimizer step; the optimizer seconds `steptime` adds after the step,
        the busiest rank's) for the floor of the ranks' CPU over the shared cores (round 21,
        `sharing.cpu_floor_s`). The optimizer is priced as `steptime._pipeline_step` prices it
        (`optimizer_step_time_s` on the cluster's device over the rank's trainable local elements and tensors,
        ZeRO-1: a dp-th of them), times `shared` in the simulation's seconds like the compute."""
        sync = sync_cpu_s(c.dp, [s["grads"] for s in st], self.cluster.sharing, self.overlap_grad_sync)
        per_element = bytes_per_param(resolve_precision(self.config.precision, self.cluster.device,
                                                        traced_in_low_precision(self.traced)), self.config.optimizer)
        host, after = [], 0.0
        for r in ranks:
            shapes = [shape for k in r["stages"] for g in st[k]["segs"]
                      for shape, _ in self.prices(c.tp, st[k]["lean"]).grad_shapes[g]]
            numel = sum(math.prod(shape) for shape in shapes) / (c.dp if self.zero1 else 1)
            opt = optimizer_step_time_s(int(numel), len(shapes), per_element, self.cluster.device)
            after = max(after, opt)
            host.append(sum(sync[k] for k in r["stages"]) + opt * shared)
        return tuple(host), after

    def to_plan(self, c: Candidate, res: dict, report: SearchReport, search: str, uncompressed_step_s: float,
                alternatives: tuple = ()) -> PipelinePlan:
        pr, seg, L = self.prices(c.tp), self.segments, self.segments.num_blocks
        sched = get_schedule(c.schedule)
        per_stage = c.dp * c.tp
        stages = tuple(StageSpec(
            s, st["rank"], st["blocks"][0], st["blocks"][1], 0 in st["segs"], L + 1 in st["segs"],
            tuple(range(st["rank"] * per_stage, (st["rank"] + 1) * per_stage)),
            tuple(dict.fromkeys(n for k in st["segs"] for n in seg.nodes[k])),
            st["fwd"], st["bwd"], st["wgrad"], int(st["state"]), int(st["act"]), st["recompute"], st["lean"],
            ", ".join(seg.block_kinds[st["blocks"][0]:st["blocks"][1] + 1]))
            for s, st in enumerate(res["stages"]))
        ranks = tuple(RankCost(r, rc["stages"], rc["fwd"] + rc["bwd"] + rc["wgrad"], rc["inflight"], int(rc["memory"]))
                      for r, rc in enumerate(res["ranks"]))
        world = self.cluster.world_size
        fwd_flops, bwd_flops = graph_flops(self.traced.graph_module)
        flops = int((fwd_flops + bwd_flops) * self.global_batch / seg.trace_batch)
        peak = float(self.cluster.device.peak_flops_per_s[mfu_dtype(self.traced, self.cluster.device,
                                                                   self.config.precision)])
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
            stage_kinds=self._kinds(stages, res, c.tp), block_group=seg.group, partition=res["partition"],
            intra_stage_solver={"mesh": str(pr.plan.mesh), "solver": s.solver, "status": s.status,
                                "optimal": s.optimal, "objective_s_at_trace_batch": s.objective_s,
                                "num_groups": s.num_groups, "num_variables": s.num_variables},
            search=report,
            config={"memory_budget_bytes": self.budget + self.reserve, "memory_reserve_bytes": self.reserve,
                    "recompute": self.config.recompute, "zero1": self.zero1, "search": search,
                    "overlap_grad_sync": self.overlap_grad_sync,
                    "partitioner": self.partitioner, "optimizer": self.config.optimizer,
                    "precision": resolve_precision(self.config.precision, self.cluster.device,
                                                   traced_in_low_precision(self.traced)), "cluster": {
                        "nodes": self.cluster.num_nodes, "devices_per_node": self.cluster.devices_per_node}},
            compression=make_record(self.config, res["compression"], step, uncompressed_step_s,
                                    res.get("uncompressed_step_s", step)),
            boundary_compression=res.get("boundary_compression"), alternatives=alternatives,
            intra_stage_plan=pr.plan, stage_scale=self.sharing(c)[1])

    def _kinds(self, stages: tuple[StageSpec, ...], res: dict, tp: int) -> tuple[StageKindSummary, ...]:
        """One summary per distinct stage kind: compute and collectives per microbatch, memory at peak."""
        by_kind: dict[str, list[int]] = {}
        for st in stages:
            by_kind.setdefault(st.kind, []).append(st.index)
        out = []
        for kind, idx in by_kind.items():
            st, segs = res["stages"][idx[0]], res["stages"][idx[0]]["segs"]
            pr = self.prices(tp, st["lean"])
            comm = {k: float(pr.comm_lin_s[k][segs].sum() * res["scale"] + pr.comm_fixed_s[k][segs].sum())
                    for k in COMM_KINDS}
            total = float((pr.fwd_lin[segs].sum() + pr.bwd_lin[segs].sum() + pr.rc_extra_lin[st["recompute"]][segs].sum())
                          * res["scale"] + pr.fwd_fixed[segs].sum() + pr.bwd_fixed[segs].sum())
            mem = {"params": int(pr.params_bytes[segs].sum()), "grads": int(pr.grads_bytes[segs].sum())}
            mem["optimizer"] = int(st["state"]) - mem["params"] - mem["grads"]
            mem["activations"] = int(st["act"] * res["ranks"][st["rank"]]["inflight"])
            if st["segs"][-1] == self.segments.num_blocks + 1:  # the last stage: one microbatch of the returned outputs (`_price_partition`)
                mem["outputs"] = int(res["ranks"][st["rank"]]["outputs"])
            mem["total"] = sum(mem.values())
            out.append(StageKindSummary(kind, tuple(idx), total - sum(comm.values()), comm, mem))
        return tuple(out)
