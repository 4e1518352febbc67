"""Activation recomputation: what the planner decides and the runtime emits (one vocabulary for both).

A decision maps a region to a mode. Regions are repeated-block members, named by their module FQN as the
tracer reports them (`NodeInfo.block`, e.g. "transformer.h.3"). Modes (Korthikanti et al., "Reducing
Activation Recomputation in Large Transformer Models", MLSys 2023, Sec. 4-5):
  * "none": every tensor the block's backward needs is saved in forward;
  * "selective": the attention core (QK^T, softmax, dropout, attention x V; one fused SDPA op where the
    graph has it) is recomputed in backward, everything else is saved;
  * "full": only the block's inputs are saved; the block's whole forward runs again in backward.
`Plan.recompute` holds the regions whose mode is not "none" (the JSON key "recompute", present only when
non-empty, so plans without recomputation are byte-identical to before).
"""
from __future__ import annotations

RECOMPUTE_MODES = ("none", "selective", "full")
"""The per-region modes, cheapest in compute first."""

RECOMPUTE_OPTIONS = ("auto",) + RECOMPUTE_MODES
"""What a user may ask for (`PlanConfig.recompute`, `--recompute`): "auto" lets the planner choose per
region; a mode forces it on every repeated-block member."""

from dataclasses import dataclass
from typing import Callable

import torch

from ..tracer import Role, TracedGraph
from ..tracer.graph import carries_grad, mutated_args
from .strategies import tensor_inputs

_SOFTMAX = ("softmax", "_softmax", "_safe_softmax")
_MATMUL = ("matmul", "bmm", "baddbmm", "einsum")
# ops between QK^T and softmax (scaling, masking, casts) and between softmax and attention x V (dropout, casts,
# the expand/view of a decomposed matmul): the eager attention core of Korthikanti et al. Fig. 3
_CORE_LINKS = ("mul", "div", "add", "sub", "where", "masked_fill", "to", "_to_copy", "dropout", "native_dropout",
               "clone", "contiguous", "expand", "view", "reshape", "_unsafe_view", "getitem")


def _op(tg: TracedGraph, name: str) -> str:
    """The short op name of a node ("softmax" for aten.softmax.int, "getitem" for operator.getitem)."""
    op = tg.nodes[name].op_name
    return op.split(".")[1] if op.startswith("aten.") else op


@dataclass(frozen=True, slots=True)
class RegionRecompute:
    """What one mode recomputes in one region (structure only; `price_region` prices it).

    Attributes:
        region: the block instance (`NodeInfo.block`, e.g. "transformer.h.3").
        mode: "none", "selective" or "full".
        recomputed: call_function nodes whose forward runs again in backward; the tensors they save for
            backward are not kept (in graph order).
        kept_inputs: (consumer node, index into its `strategies.tensor_inputs`) of every tensor the recomputed part reads from outside
            itself that must be kept instead (each distinct tensor once, at its first consumer): for "full"
            the block's input activations (Chen et al. 2016, Sec. 4: a checkpointed segment keeps its
            inputs); for "selective" the attention core's Q, K, V (Korthikanti et al. 2022, Sec. 5).
        rerun_edges: (consumer node, index into its `strategies.tensor_inputs`) of every input of a recomputed
            node whose producer is not a parameter or buffer (graph order): the rewriter emits the
            redistribution of such an input inside the region (`rewriter.recompute`: what it emits for a
            recomputed node, its collectives included, belongs to the region), so its forward collectives run
            again in backward (Megatron's full recomputation re-runs a tensor-parallel block's all-reduce /
            all-gathers; the attention core of "selective" has none on a head-sharded layout). A parameter's
            use collective (an FSDP all-gather) is not listed: inside a region it replaces the re-gather that
            reshard-after-forward would run in backward, which every plan already pays
            (`rewriter.apply`: "a recomputed gather needs no reshard").
    """

    region: str
    mode: str
    recomputed: tuple[str, ...] = ()
    kept_inputs: tuple[tuple[str, int], ...] = ()
    rerun_edges: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class RegionPrice:
    """Price of one region's mode: `extra_fwd_s` seconds of forward compute run again in backward,
    `saved_delta_bytes` (<= 0 normally) added to the region's saved-for-backward bytes, and `rerun_comm_s`
    seconds of the forward collectives that run again (`RegionRecompute.rerun_edges`). Each may be a linear
    form over ILP variables (`problem.recompute_terms`)."""

    extra_fwd_s: object
    saved_delta_bytes: object
    rerun_comm_s: object = 0.0

    @property
    def extra_s(self) -> object:
        """Seconds the mode adds to backward: the recomputed compute and the collectives it runs again."""
        return self.extra_fwd_s + self.rerun_comm_s


def regions(tg: TracedGraph) -> dict[str, tuple[str, ...]]:
    """Every repeated-block member (region) -> its node names in graph order, groups in `tg.blocks` order."""
    return {member: tuple(nodes) for group in tg.blocks for member, nodes in zip(group.members, group.nodes)}


def attention_core(tg: TracedGraph, nodes: tuple[str, ...]) -> tuple[str, ...]:
    """The attention core of a block (Korthikanti et al. 2022, Sec. 5: QK^T, softmax, dropout, attention x V),
    in graph order: every SDPA op (with its getitem outputs), or per softmax the chain of `_CORE_LINKS` ops
    back to the matmul that computes its input (QK^T) and forward to the matmul that consumes it (x V),
    both matmuls included. Empty when the block has neither (e.g. an MLP block)."""
    inside = set(nodes)
    core: set[str] = set()
    for name in nodes:
        op = _op(tg, name)
        if "scaled_dot_product" in op:
            core.add(name)
            core.update(u.name for u in tg.nodes[name].node.users if u.name in inside and _op(tg, u.name) == "getitem")
        elif op in _SOFTMAX:
            core.add(name)
            core |= _walk(tg, name, inside, forward=False) | _walk(tg, name, inside, forward=True)
    return tuple(n for n in nodes if n in core)


def _walk(tg: TracedGraph, start: str, inside: set[str], forward: bool) -> set[str]:
    """Nodes reached from `start` through `_CORE_LINKS` ops up to (and including) the first matmul."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        node = tg.nodes[todo.pop()].node
        nxt = node.users if forward else node.all_input_nodes
        for n in nxt:
            if n.name in inside and n.name not in seen and n.op == "call_function":
                op = _op(tg, n.name)
                if op in _MATMUL:
                    seen.add(n.name)
                elif op in _CORE_LINKS:
                    seen.add(n.name)
                    todo.append(n.name)
    return seen


def region_recompute(tg: TracedGraph, region: str, nodes: tuple[str, ...], mode: str,
                     shared: frozenset[str] = frozenset()) -> RegionRecompute:
    """The structure of `mode` on one region (`RegionRecompute`).

    Args:
        shared: tensors read by several regions (masks, position ids): alive for the whole step anyway, so
            neither kept per region nor counted as its input.
    Raises:
        ValueError: an unknown mode.
    """
    if mode not in RECOMPUTE_MODES:
        raise ValueError(f"recompute mode {mode!r} of region {region!r}: use one of {RECOMPUTE_MODES}")
    if mode == "none":
        return RegionRecompute(region, mode)
    part = nodes if mode == "full" else attention_core(tg, nodes)
    part = tuple(n for n in part if tg.nodes[n].op == "call_function")
    inside = set(part)
    kept: list[tuple[str, int]] = []
    rerun: list[tuple[str, int]] = []
    seen: set[str] = set()
    for name in part:
        for k, ti in enumerate(tensor_inputs(tg, tg.nodes[name])):
            if tg.nodes[ti.producer].role not in (Role.PARAMETER, Role.BUFFER):
                rerun.append((name, k))
            if (ti.producer in inside or ti.producer in seen or ti.producer in shared
                    or tg.nodes[ti.producer].role in (Role.PARAMETER, Role.BUFFER) or not carries_grad(ti.dtype)):
                continue
            seen.add(ti.producer)
            kept.append((name, k))
    return RegionRecompute(region, mode, part, tuple(kept), tuple(rerun))


def shared_inputs(tg: TracedGraph) -> frozenset[str]:
    """Nodes outside every region read by two or more regions (e.g. GPT-2's causal mask)."""
    readers: dict[str, set[str]] = {}
    for region, nodes in regions(tg).items():
        inside = set(nodes)
        for name in nodes:
            for arg in tg.nodes[name].node.all_input_nodes:
                if arg.name not in inside:
                    readers.setdefault(arg.name, set()).add(region)
    return frozenset(n for n, r in readers.items() if len(r) > 1)


def price_region(rr: RegionRecompute, fwd_s: Callable[[str], object], saved_bytes: Callable[[str], object],
                 input_bytes: Callable[[str, int], object],
                 rerun_s: Callable[[str, int], object] | None = None) -> RegionPrice:
    """Price one region's mode, the ONE formula every planner path uses (the ILP's linear forms,
    `problem.py`; a fixed plan's, `api.recompute_prices`, which `segments.py` and `to_plan` use):

        extra_fwd_s       = sum over recomputed nodes n of fwd_s(n)
        saved_delta_bytes = sum over kept inputs (n, k) of input_bytes(n, k) - sum over recomputed n of saved_bytes(n)
        rerun_comm_s      = sum over rerun edges (n, k) of rerun_s(n, k)   (0 without `rerun_s`)

    i.e. the region's saved bytes under the mode are its saved bytes without recomputation minus what the
    recomputed ops save plus what must be kept for them (Chen et al. 2016, Sec. 4; Korthikanti et al. 2022,
    Sec. 4-5: full keeps the block input, 2sbh bytes in bf16 per layer; selective keeps all but the
    5as^2b bytes of QK^T, softmax, dropout mask and dropout output). rerun_s(n, k) is the forward
    seconds of the redistribution of input k of n that the program runs again (`RegionRecompute.rerun_edges`:
    a full tensor-parallel block's all-reduce and all-gathers); at fixed strategies a value's copy per target
    layout is paid once (`shared_uses`), the ILP's form pays it per use (an upper bound, `problem.py`). The
    callables return numbers (at fixed strategies) or linear forms over ILP variables.
    """
    extra: object = 0.0
    delta: object = 0
    rerun: object = 0.0
    for n in rr.recomputed:
        extra = extra + fwd_s(n)
        delta = delta - saved_bytes(n)
    for n, k in rr.kept_inputs:
        delta = delta + input_bytes(n, k)
    if rerun_s is not None:
        for n, k in rr.rerun_edges:
            rerun = rerun + rerun_s(n, k)
    return RegionPrice(extra, delta, rerun)


def forced_regions(tg: TracedGraph) -> dict[str, str]:
    """Regions the user checkpointed (`traced.user_recompute`, region -> "full"; set by the tracer), mapped
    onto repeated-block members and forced: a member itself; a module inside a member (e.g.
    "transformer.h.3.mlp") forces its member (the planner's regions are whole blocks: recomputing the
    block is a superset of what the user asked); a module holding members (e.g. "transformer.h") forces
    each of them. The strongest mode wins where several map onto one member. A region is named by the
    module holding it, with an "@checkpoint<k>" suffix when it is not a whole module (`tracer.trace`); the
    suffix is ignored here. A region outside every repeated block (and holding none) is not a planner
    region: it is not priced, and `parallelizer.plan` still puts it into `Plan.recompute` so the emitted
    program recomputes it as the user asked (`rewriter.recompute`). A block whose forward writes state in place
    (`state_writing`: a BatchNorm's running statistics, an EMA buffer) is forced "none", whatever
    `PlanConfig.recompute` says, unless the user checkpointed it.

    Raises:
        ValueError: a mode outside `RECOMPUTE_MODES`.
    """
    known = regions(tg)
    out: dict[str, str] = {r: "none" for r in state_writing(tg)}
    for region, mode in sorted(dict(getattr(tg, "user_recompute", None) or {}).items()):
        if mode not in RECOMPUTE_MODES:
            raise ValueError(f"user checkpoint region {region!r} -> {mode!r}: modes are {RECOMPUTE_MODES}")
        module = region.split("@", 1)[0]
        members = [r for r in known if r == module or module.startswith(r + ".") or r.startswith(module + ".")
                   or module == ""]
        for r in members:
            if RECOMPUTE_MODES.index(mode) > RECOMPUTE_MODES.index(out.get(r, "none")):
                out[r] = mode
    return dict(sorted(out.items()))


def state_writing(tg: TracedGraph) -> dict[str, str]:
    """Region -> the first of its ops that writes in place into a value made outside the region (a BatchNorm's
    running statistics and counter, an EMA buffer, a parameter written in forward): recomputing the region would
    write it twice, so `rewriter.recompute` refuses it and the planner never chooses it (`forced_regions`).
    Before, `recompute="full"` (or "auto" under a tight budget) on a model of Linear/Conv -> BatchNorm blocks
    made a plan whose program raised UnsupportedOpError on every rank (round 13)."""
    out: dict[str, str] = {}
    for region, names in regions(tg).items():
        inside = set(names)
        for name in names:
            node = tg.nodes[name].node
            written = [node.args[i] for i in mutated_args(node) if i < len(node.args)]
            if any(isinstance(w, torch.fx.Node) and w.name not in inside for w in written):
                out[region] = name
                break
    return out


def runnable(tg: TracedGraph, decision: dict[str, str]) -> dict[str, str]:
    """`decision` (region -> mode, a plan's `recompute`) without what `rewriter.recompute` refuses: the blocks
    `forced_regions` forces "none" (`state_writing`), and "selective" on a block that has no attention core
    (`attention_core` empty: an MLP or conv block, which it would not change): recompute="selective" (or a
    pipeline stage's "selective" on such blocks) made a plan whose program raised UnsupportedOpError on every rank
    (round 13). Regions that are not blocks (a user's checkpoint) are kept."""
    blocks = regions(tg)
    kept = {r for r, m in forced_regions(tg).items() if m == "none"}
    return {r: m for r, m in decision.items() if r not in kept
            and not (m == "selective" and r in blocks and not attention_core(tg, blocks[r]))}
