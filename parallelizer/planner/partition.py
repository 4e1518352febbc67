"""Stage partitioning: cut a chain of L blocks into S contiguous stages of >= 1 block, minimising the
slowest stage's time per microbatch, under a memory limit per stage.

Stage s holding blocks [i, j) costs (seconds per microbatch)

    time(s, i, j) = sum(block_s[i:j]) + pre_s [s = 0] + post_s [s = S-1]
                    + cut_bwd_s[i] [s > 0] + cut_fwd_s[j] [s < S-1]

(pre/post: the embedding before the first block and the head/loss after the last; cut_*[k]: the
point-to-point send of the activation crossing the cut before block k, paid forward by the stage before
the cut and backward by the stage after it), and needs (bytes per device)

    memory(s, i, j) = state(i, j) + inflight[s] * activations(i, j)   (+ the pre/post parts on the ends)

Activation recomputation: with M modes (`ChainCosts.modes`, cheapest in compute first; each a row of
per-block seconds and saved bytes) a stage takes one mode for its blocks, and time(s, i, j) /
memory(s, i, j) are those of the cheapest mode whose memory fits (a block's seconds grow and its saved
bytes shrink with recomputation, so the fastest feasible mode is the first that fits); the DP below is
unchanged otherwise and stays exact for that per-stage choice.

Memory-lean stage layouts (`planner.search`): a mode may also stand for another intra-stage layout (the
sequence-parallel-like one of `ilp.solve_lean`), whose parameters' state and embedding / head parts differ
too: `mode_block_state_bytes` and `mode_ends` give them per mode (default: the same for every mode). The
modes are then ordered by their seconds per block (the search sorts them), and a stage still takes the first
that fits; exact when every block and the end parts order the modes alike (identical blocks: always).

Dynamic programme over cut positions: best[s][j] = min over i of max(best[s-1][i], time(s, i, j)) among
feasible (memory(s, i, j) <= limit[s]) stages; O(M S L^2), vectorised over (i, j) with numpy. Exact for the
min-max objective (the same recurrence as the linear partition problem, Skiena, "The Algorithm Design
Manual", Sec. 8.5); ties go to the earliest cut (numpy argmin), so results are deterministic.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class ChainCosts:
    """Per-microbatch costs of the block chain. Lengths: block_* L, cut_* L+1 (index k = cut before block
    k; entries 0 and L are never used). Seconds and bytes per device.

    Raises:
        ValueError: empty chain or mismatched lengths.
    """

    block_s: tuple[float, ...]
    block_state_bytes: tuple[float, ...]
    block_act_bytes: tuple[float, ...]
    pre_s: float = 0.0
    post_s: float = 0.0
    pre_state_bytes: float = 0.0
    pre_act_bytes: float = 0.0
    post_state_bytes: float = 0.0
    post_act_bytes: float = 0.0
    cut_fwd_s: tuple[float, ...] = field(default=())
    cut_bwd_s: tuple[float, ...] = field(default=())
    modes: tuple[str, ...] = ("none",)
    mode_block_s: tuple[tuple[float, ...], ...] = ()
    mode_block_act_bytes: tuple[tuple[float, ...], ...] = ()
    mode_block_state_bytes: tuple[tuple[float, ...], ...] = ()
    mode_ends: tuple[tuple[float, float, float, float, float, float], ...] = ()

    def __post_init__(self) -> None:
        """`mode_block_s` / `mode_block_act_bytes` / `mode_block_state_bytes`: one row per entry of `modes`
        (default: `block_s` / `block_act_bytes` for a single mode "none", `block_state_bytes` for every mode);
        `mode_ends`: per mode (pre_s, post_s, pre_state_bytes, pre_act_bytes, post_state_bytes, post_act_bytes)
        (default: the fields' values for every mode)."""
        n = len(self.block_s)
        if n == 0:
            raise ValueError("ChainCosts.block_s is empty: need at least one block")
        ends = (self.pre_s, self.post_s, self.pre_state_bytes, self.pre_act_bytes, self.post_state_bytes,
                self.post_act_bytes)
        object.__setattr__(self, "mode_block_state_bytes", tuple(tuple(r) for r in self.mode_block_state_bytes)
                           or (tuple(self.block_state_bytes),) * len(self.modes))
        object.__setattr__(self, "mode_ends", tuple(tuple(float(x) for x in e) for e in self.mode_ends)
                           or (ends,) * len(self.modes))
        if len(self.mode_ends) != len(self.modes) or any(len(e) != 6 for e in self.mode_ends):
            raise ValueError(f"ChainCosts.mode_ends: need one 6-tuple per mode of {self.modes}")
        for name, base in (("mode_block_s", self.block_s), ("mode_block_act_bytes", self.block_act_bytes),
                           ("mode_block_state_bytes", self.block_state_bytes)):
            rows = tuple(tuple(r) for r in getattr(self, name)) or (tuple(base),)
            object.__setattr__(self, name, rows)
            if len(rows) != len(self.modes) or any(len(r) != n for r in rows):
                raise ValueError(f"ChainCosts.{name}: need one row of {n} entries per mode of {self.modes}")
        for name in ("block_state_bytes", "block_act_bytes"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"ChainCosts.{name} has {len(getattr(self, name))} entries, block_s has {n}")
        for name in ("cut_fwd_s", "cut_bwd_s"):
            value = getattr(self, name) or (0.0,) * (n + 1)
            object.__setattr__(self, name, tuple(value))
            if len(value) != n + 1:
                raise ValueError(f"ChainCosts.{name} has {len(value)} entries: need num_blocks + 1 = {n + 1}")

    @property
    def num_blocks(self) -> int:
        return len(self.block_s)

    def stage_time_s(self, s: int, num_stages: int, i: int, j: int, mode: int = 0) -> float:
        """time(s, i, j) of the module docstring, its blocks in mode `modes[mode]`."""
        pre_s, post_s = self.mode_ends[mode][:2]
        return float(sum(self.mode_block_s[mode][i:j]) + (pre_s if s == 0 else 0.0)
                     + (post_s if s == num_stages - 1 else 0.0)
                     + (self.cut_bwd_s[i] if s > 0 else 0.0) + (self.cut_fwd_s[j] if s < num_stages - 1 else 0.0))

    def stage_memory_bytes(self, s: int, num_stages: int, i: int, j: int, inflight: float = 1.0,
                           mode: int = 0) -> tuple[float, float]:
        """(state bytes, activation bytes of ONE microbatch) of stage s over blocks [i, j) in mode `mode`."""
        first, last = s == 0, s == num_stages - 1
        _, _, pre_state, pre_act, post_state, post_act = self.mode_ends[mode]
        state = sum(self.mode_block_state_bytes[mode][i:j]) + first * pre_state + last * post_state
        act = sum(self.mode_block_act_bytes[mode][i:j]) + first * pre_act + last * post_act
        return float(state), float(act)

    def stage_mode(self, s: int, num_stages: int, i: int, j: int, inflight: float, limit_bytes: float) -> int:
        """The cheapest mode (index into `modes`) in which stage s over blocks [i, j) fits `limit_bytes` with
        `inflight` microbatches' activations, or the leanest mode when none fits."""
        need = [st + inflight * act for st, act in (self.stage_memory_bytes(s, num_stages, i, j, inflight, m)
                                                    for m in range(len(self.modes)))]
        return next((m for m, b in enumerate(need) if b <= limit_bytes), int(np.argmin(need)))


@dataclass(frozen=True, slots=True)
class Partition:
    """Cuts (S + 1 block indices, 0 first and L last: stage s holds blocks [cuts[s], cuts[s+1])), the
    slowest stage's seconds per microbatch, and each stage's mode (index into `ChainCosts.modes`)."""

    cuts: tuple[int, ...]
    max_stage_s: float
    modes: tuple[int, ...] = ()

    def blocks(self, s: int) -> range:
        return range(self.cuts[s], self.cuts[s + 1])


def partition_chain(costs: ChainCosts, num_stages: int, inflight: tuple[float, ...] | None = None,
                    limit_bytes: tuple[float, ...] | float = math.inf) -> Partition | None:
    """The min-max partition of the module docstring, or None when no partition fits the memory limits.

    Args:
        costs: the chain.
        num_stages: S, 1 <= S <= L.
        inflight: microbatches whose activations stage s keeps (S entries; default 1 each).
        limit_bytes: per-stage memory limit (one number, or S entries).
    Raises:
        ValueError: S out of range or wrong lengths.
    """
    n, S = costs.num_blocks, num_stages
    if not 1 <= S <= n:
        raise ValueError(f"num_stages={S}: must be in [1, {n}] (one block per stage at least)")
    inflight = tuple(inflight) if inflight is not None else (1.0,) * S
    limits = (float(limit_bytes),) * S if isinstance(limit_bytes, (int, float)) else tuple(limit_bytes)
    if len(inflight) != S or len(limits) != S:
        raise ValueError(f"inflight ({len(inflight)}) and limit_bytes ({len(limits)}) need {S} entries")
    ranges = lambda x: (lambda c: c[None, :] - c[:, None])(np.concatenate([np.zeros(1), np.cumsum(x)]))
    base_t = np.stack([ranges(row) for row in costs.mode_block_s])  # (M, i, j)
    base_act = np.stack([ranges(row) for row in costs.mode_block_act_bytes])
    base_state = np.stack([ranges(row) for row in costs.mode_block_state_bytes])
    ii, jj = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    valid = jj > ii
    cut_fwd, cut_bwd = np.asarray(costs.cut_fwd_s), np.asarray(costs.cut_bwd_s)
    best = np.full(n + 1, math.inf)
    best[0] = 0.0
    choice = np.zeros((S, n + 1), dtype=int)
    for s in range(S):
        first, last = s == 0, s == S - 1
        cuts_s = 0.0
        if not first:
            cuts_s = cuts_s + cut_bwd[:, None]
        if not last:
            cuts_s = cuts_s + cut_fwd[None, :]
        allowed = valid & (ii == 0 if first else True) & (jj == n if last else True)
        # per (i, j) the time of the first mode that fits (module docstring); inf where none fits
        t = np.full((n + 1, n + 1), math.inf)
        for m in range(len(costs.modes) - 1, -1, -1):
            pre_s, post_s, pre_state, pre_act, post_state, post_act = costs.mode_ends[m]
            state = base_state[m] + first * pre_state + last * post_state
            room = limits[s] - state - inflight[s] * (first * pre_act + last * post_act)
            t = np.where(inflight[s] * base_act[m] <= room, base_t[m] + first * pre_s + last * post_s, t)
        cand = np.where(allowed, np.maximum(best[:, None], t + cuts_s), math.inf)
        choice[s] = np.argmin(cand, axis=0)
        best = cand[choice[s], np.arange(n + 1)]
    if not math.isfinite(best[n]):
        return None
    cuts = [n]
    for s in range(S - 1, -1, -1):
        cuts.append(int(choice[s][cuts[-1]]))
    cuts.reverse()
    modes = tuple(costs.stage_mode(s, S, cuts[s], cuts[s + 1], inflight[s], limits[s]) for s in range(S))
    return Partition(tuple(cuts), float(best[n]), modes)


def uniform_partition(num_blocks: int, num_stages: int) -> tuple[int, ...]:
    """Megatron-style even split (the first num_blocks % S stages get one more block); the cuts."""
    q, r = divmod(num_blocks, num_stages)
    cuts = [0]
    for s in range(num_stages):
        cuts.append(cuts[-1] + q + (1 if s < r else 0))
    return tuple(cuts)
