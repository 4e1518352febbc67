"""Collective communication time in the alpha-beta (latency-bandwidth) model.

Byte convention (``nbytes``) follows nccl-tests' "size" column (nccl-tests doc/PERFORMANCE.md):

=============== ===========================================
all_reduce      the buffer, same on input and output
all_gather      the OUTPUT (full, gathered) buffer
reduce_scatter  the INPUT (full, unscattered) buffer
all_to_all      the per-rank send (= receive) buffer
broadcast       the buffer
send_recv       the message (point-to-point, one hop)
=============== ===========================================

Flat (single-link) cost on n ranks, with alpha = ``Link.latency_s`` and beta = ``Link.bandwidth_bytes_per_s``
(per-direction per-GPU, see :mod:`cost_model.topology`)::

    time_s = latency_steps(kind, n) * alpha + bytes_factor(kind, n) * nbytes / beta

Ring algorithms (Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in
MPICH", IJHPCA 2005, Sec. 4; the bytes factors are nccl-tests' bus-bandwidth factors, PERFORMANCE.md):

=============== ================== ===============
kind            latency_steps       bytes_factor
=============== ================== ===============
all_reduce      2(n-1)              2(n-1)/n        (reduce-scatter then all-gather)
all_gather      n-1                 (n-1)/n
reduce_scatter  n-1                 (n-1)/n
all_to_all      n-1                 (n-1)/n         (pairwise exchange)
broadcast       n-1                 1               (pipelined chain)
send_recv       1                   1
=============== ================== ===============

Tree algorithms (pipelined binary trees as NCCL uses them; NCCL's tuning model, NVIDIA/nccl
src/graph/tuning.cc, gives trees half the ring's algorithm bandwidth and log-depth latency):
all_reduce = reduce up then broadcast down: ``2*ceil(log2 n)`` steps, bytes factor 2;
broadcast: ``ceil(log2 n)`` steps, bytes factor 1. NCCL implements the other collectives only as
rings, so ``algorithm="tree"`` prices them as rings. Hence tree beats ring for small messages (latency)
and loses for large ones (bandwidth) once n > 2.

Groups spanning nodes (g ranks per node, m nodes, n = g*m) can run all_reduce, all_gather and
reduce_scatter (:data:`HIERARCHICAL_KINDS`) in one of two ways, and each collective is priced as the cheaper
one (:func:`collective_algorithm`; equal estimates -> flat):

* flat: one ring over all n ranks; every ring step waits for its slowest hop, the inter-node link, so it is
  ``flat_collective_time_s(kind, nbytes, n, inter)`` (the ring bound of Thakur et al. Sec. 4 on the
  slowest link);
* hierarchical (two-level: Horovod's hierarchical allreduce, horovod/horovod PR #411, NCCL reduce-scatter
  -> MPI all-reduce -> NCCL all-gather; Cho et al., "BlueConnect: Decomposing All-Reduce for Deep Learning
  on Heterogeneous Network Hierarchy", SysML 2019; Jia et al., arXiv 1807.11205, "hierarchical all-reduce"):
  all_reduce = reduce-scatter inside the node (g ranks, nbytes) + all_reduce across nodes on nbytes/g
  (m ranks, inter-node link; the g local ranks run their m-rank all-reduces in parallel, one NIC each)
  + all-gather inside the node. all_gather = cross-node all-gather producing nbytes/g, then intra-node
  all-gather to nbytes; reduce_scatter is its mirror (intra-node first, then across nodes on nbytes/g).

With alpha/beta per link and no overrides, hierarchical is never dearer than flat when the intra-node link
is at least as fast as the inter-node one (it has (g-1)+(m-1) <= n-1 latency steps per phase pair and the
same bytes over the slow link divided by g); flat wins when the intra-node link is the slower one, or where
per-kind overrides or size fits (calibrated profiles) make the intra-node phases dear.
:func:`hierarchical_byte_ranges` gives the message sizes for which hierarchical is strictly cheaper: the
planner records them in the plan and the runtime picks the algorithm of each collective by its bytes
(``parallelizer.rewriter.hierarchical``), so the emitted program runs what was priced.

The other kinds over groups spanning nodes: all_to_all sends (g-1)/n of the buffer over the intra-node link
and (n-g)/n over the inter-node link (one message per peer). broadcast = a cross-node then an intra-node
broadcast. send_recv between neighbours of a group that spans nodes is priced on
the inter-node link (the slowest hop bounds a pipeline).

Per-kind overrides (``Link.per_kind``, see :mod:`cost_model.topology`): wherever a formula above uses
alpha/beta of a link for a collective of some kind, it uses ``link.alpha_beta(kind)``, i.e. the link's
override for that kind when it has one; the step and byte factors stay those of the tables. In the
two-level algorithm each phase is priced with the override of the phase's own kind on the phase's link
(e.g. a cross-node all_reduce = intra reduce_scatter + inter all_reduce + intra all_gather uses the
intra link's reduce_scatter and all_gather overrides and the inter link's all_reduce override);
all_to_all's per-peer messages use the ``"all_to_all"`` override of each link.
"""

from __future__ import annotations

import functools
import math

from cost_model.hardware import DeviceSpec
from cost_model.topology import COLLECTIVE_KINDS, Link, MeshTopology

__all__ = ["COLLECTIVE_KINDS", "ALGORITHMS", "HIERARCHICAL_KINDS", "alpha_beta_coefficients", "flat_collective_time_s",
           "step_collective_s", "collective_wait_s",
           "collective_time_s", "collective_algorithm", "hierarchical_byte_ranges", "overlapped_comm_exposed_s"]

ALGORITHMS = ("ring", "tree")
HIERARCHICAL_KINDS = ("all_reduce", "all_gather", "reduce_scatter")
"""Collective kinds with a two-level (hierarchical) algorithm over groups that span nodes (module docstring)."""


def _check_kind_algorithm(kind: str, algorithm: str) -> None:
    if kind not in COLLECTIVE_KINDS:
        raise ValueError(f"unknown collective kind {kind!r}; use one of {COLLECTIVE_KINDS}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; use one of {ALGORITHMS}")


def alpha_beta_coefficients(kind: str, num_ranks: int, algorithm: str = "ring") -> tuple[float, float]:
    """Return ``(latency_steps, bytes_factor)`` of ``kind`` on ``num_ranks`` ranks over one link.

    ``time_s = latency_steps * alpha + bytes_factor * nbytes / beta``; table and sources in the module
    docstring. One rank costs nothing: ``(0.0, 0.0)``.

    Raises:
        ValueError: unknown ``kind``/``algorithm`` or ``num_ranks < 1``.
    """
    _check_kind_algorithm(kind, algorithm)
    n = num_ranks
    if not (isinstance(n, int) and n >= 1):
        raise ValueError(f"num_ranks={n!r}: must be an int >= 1")
    if n == 1:
        return 0.0, 0.0
    if algorithm == "tree" and kind in ("all_reduce", "broadcast"):
        depth = math.ceil(math.log2(n))
        return (2.0 * depth, 2.0) if kind == "all_reduce" else (float(depth), 1.0)
    if kind == "all_reduce":
        return 2.0 * (n - 1), 2.0 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return float(n - 1), (n - 1) / n
    if kind == "broadcast":
        return float(n - 1), 1.0
    return 1.0, 1.0  # send_recv


def flat_collective_time_s(kind: str, nbytes: float, num_ranks: int, link: Link, algorithm: str = "ring") -> float:
    """Seconds for ``kind`` on ``num_ranks`` ranks all connected by ``link`` (no hierarchy).

    Uses ``link.alpha_beta(kind, nbytes)``: the link's size fit or per-kind override for ``kind`` if it has one.

    Args:
        nbytes: bytes in the nccl-tests convention (module docstring), >= 0.

    Raises:
        ValueError: unknown kind/algorithm, bad ``num_ranks`` or negative ``nbytes``.
    """
    if not nbytes >= 0:
        raise ValueError(f"nbytes={nbytes!r}: must be >= 0")
    steps, factor = alpha_beta_coefficients(kind, num_ranks, algorithm)
    if nbytes == 0 or steps == 0:
        return 0.0
    latency_s, bandwidth_bytes_per_s = link.alpha_beta(kind, nbytes)
    return steps * latency_s + factor * nbytes / bandwidth_bytes_per_s


def collective_time_s(kind: str, nbytes: float, topo: MeshTopology, axes: tuple[str, ...] | str,
                      algorithm: str = "ring") -> float:
    """Seconds for one collective over the process group spanned by mesh ``axes``.

    Several axes (e.g. ``("dp", "tp")``) form one group whose size is the product of their sizes.
    A group inside one node is priced flat on the intra-node link; over a group spanning nodes, all_reduce,
    all_gather and reduce_scatter are priced as the cheaper of the flat ring and the two-level algorithm
    (:func:`collective_algorithm`), the other kinds by their cross-node formulas (module docstring). Each
    (phase) collective uses its link's per-kind override when the link has one for that kind (module docstring). ``algorithm`` applies to the cross-node all-reduce /
    broadcast phase and to single-node groups.

    Args:
        kind: one of :data:`COLLECTIVE_KINDS`.
        nbytes: bytes in the nccl-tests convention (module docstring), >= 0.
        topo: the mesh on its cluster.
        axes: one mesh axis name or a tuple of names.
        algorithm: ``"ring"`` or ``"tree"``.

    Returns:
        Seconds, ``0.0`` for a size-1 group or ``nbytes == 0``.

    Raises:
        ValueError: unknown kind, algorithm or axis name, or negative ``nbytes``.
    """
    _check_kind_algorithm(kind, algorithm)
    if not nbytes >= 0:
        raise ValueError(f"nbytes={nbytes!r}: must be >= 0")
    info = topo.group_info(axes)
    if info.size == 1 or nbytes == 0:
        return 0.0
    intra, inter = topo.cluster.intra_node_link, topo.cluster.inter_node_link
    g, m, n = info.ranks_per_node, info.num_nodes, info.size
    if m == 1:
        return flat_collective_time_s(kind, nbytes, n, intra, algorithm)
    if kind in HIERARCHICAL_KINDS:
        hierarchical = collective_algorithm(kind, nbytes, topo, axes, algorithm) == "hierarchical"
        return _phases_time_s(_phases(kind, g, m, intra, inter, algorithm, hierarchical), nbytes)
    if kind == "all_to_all":
        (intra_alpha, intra_beta), (inter_alpha, inter_beta) = intra.alpha_beta(kind, nbytes), inter.alpha_beta(kind, nbytes)
        return ((g - 1) * (intra_alpha + nbytes / n / intra_beta)
                + (n - g) * (inter_alpha + nbytes / n / inter_beta))
    if kind == "broadcast":
        return (flat_collective_time_s("broadcast", nbytes, m, inter, algorithm)
                + flat_collective_time_s("broadcast", nbytes, g, intra, algorithm))
    return flat_collective_time_s("send_recv", nbytes, 2, inter)


# A phase of a collective: (kind, bytes as a fraction of the collective's nbytes, ranks, link, algorithm).
_Phase = tuple[str, float, int, Link, str]


def _phases(kind: str, g: int, m: int, intra: Link, inter: Link, algorithm: str,
            hierarchical: bool) -> tuple[_Phase, ...]:
    """The phases of ``kind`` (one of HIERARCHICAL_KINDS) over g ranks per node on m > 1 nodes (module docstring)."""
    if not hierarchical or g == 1:
        return ((kind, 1.0, g * m, inter, algorithm),)
    if kind == "all_reduce":
        return (("reduce_scatter", 1.0, g, intra, "ring"), ("all_reduce", 1.0 / g, m, inter, algorithm),
                ("all_gather", 1.0, g, intra, "ring"))
    return ((kind, 1.0 / g, m, inter, "ring"), (kind, 1.0, g, intra, "ring"))


def _phases_time_s(phases: tuple[_Phase, ...], nbytes: float) -> float:
    return sum(flat_collective_time_s(k, nbytes * share, n, link, alg) for k, share, n, link, alg in phases)


def _linear(phases: tuple[_Phase, ...], nbytes: float) -> tuple[float, float]:
    """``(a, b)`` with ``time_s = a + b * S`` for S near ``nbytes`` (exact between size-fit boundaries)."""
    a = b = 0.0
    for kind, share, n, link, alg in phases:
        steps, factor = alpha_beta_coefficients(kind, n, alg)
        if steps:
            latency_s, bandwidth = link.alpha_beta(kind, nbytes * share)
            a, b = a + steps * latency_s, b + factor * share / bandwidth
    return a, b


def collective_algorithm(kind: str, nbytes: float, topo: MeshTopology, axes: tuple[str, ...] | str,
                         algorithm: str = "ring") -> str:
    """``"hierarchical"`` when ``kind`` over the group of ``axes`` is a two-level collective strictly cheaper
    than the flat ring for a message of ``nbytes`` (``nbytes`` inside :func:`hierarchical_byte_ranges`), else
    ``"flat"`` (a group inside one node, one rank per node, a kind outside :data:`HIERARCHICAL_KINDS`, or a tie).

    Raises:
        ValueError: unknown kind, algorithm or axis name, or negative ``nbytes``.
    """
    _check_kind_algorithm(kind, algorithm)
    if not nbytes >= 0:
        raise ValueError(f"nbytes={nbytes!r}: must be >= 0")
    ranges = hierarchical_byte_ranges(kind, topo, axes, algorithm)
    return "hierarchical" if any(lo < nbytes <= hi for lo, hi in ranges) else "flat"


def hierarchical_byte_ranges(kind: str, topo: MeshTopology, axes: tuple[str, ...] | str,
                             algorithm: str = "ring") -> tuple[tuple[float, float], ...]:
    """Message sizes (bytes, nccl-tests convention) for which the two-level algorithm of ``kind`` over the group
    of ``axes`` is strictly cheaper than the flat ring: disjoint intervals ``(lo, hi]`` (a size-fit segment
    holds the sizes up to and including its upper bound), sorted, ``hi`` may be ``math.inf``; ``()`` when never
    (a group inside one node or with one rank per node, a kind outside :data:`HIERARCHICAL_KINDS`, a slower
    intra-node link...).

    Both estimates are affine in the message size S between the boundaries of the links' size fits
    (``Link.size_fits``; each phase sees ``S * share``), so on each such piece their difference ``a + b*S`` is
    solved exactly; a difference within 1e-12 relative of zero is a tie (flat), and so is the crossing point
    itself (an interval ending at one stops at the float just below it). Cached per argument tuple.

    Raises:
        ValueError: unknown kind, algorithm or axis name.
    """
    _check_kind_algorithm(kind, algorithm)
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    return _byte_ranges(kind, topo, axes, algorithm)


@functools.lru_cache(maxsize=256)
def _byte_ranges(kind: str, topo: MeshTopology, axes: tuple[str, ...],
                 algorithm: str) -> tuple[tuple[float, float], ...]:
    info = topo.group_info(axes)
    g, m = info.ranks_per_node, info.num_nodes
    if kind not in HIERARCHICAL_KINDS or g == 1 or m == 1:
        return ()
    intra, inter = topo.cluster.intra_node_link, topo.cluster.inter_node_link
    hier, flat = (_phases(kind, g, m, intra, inter, algorithm, h) for h in (True, False))
    cuts = {0.0, math.inf}  # piece boundaries: where a phase's message crosses a size-fit segment's upper bound
    for k, share, _, link, _ in hier + flat:
        cuts.update(upper / share for upper, _, _ in link.size_fits.get(k, ()))
    cuts = sorted(cuts)
    ranges: list[list[float]] = []
    for lo, hi in zip(cuts, cuts[1:]):
        probe = 2 * lo + 1 if hi == math.inf else (lo + hi) / 2
        (ah, bh), (af, bf) = _linear(hier, probe), _linear(flat, probe)
        a = 0.0 if abs(ah - af) <= 1e-12 * max(ah, af) else ah - af
        b = 0.0 if abs(bh - bf) <= 1e-12 * max(bh, bf) else bh - bf
        if b == 0:
            cheaper = (lo, hi) if a < 0 else None
        else:
            root = -a / b
            cheaper = (lo, min(hi, math.nextafter(root, 0.0))) if b > 0 else (max(lo, root), hi)
        if cheaper is None or cheaper[0] >= cheaper[1]:
            continue
        if ranges and ranges[-1][1] == cheaper[0]:
            ranges[-1][1] = cheaper[1]
        else:
            ranges.append(list(cheaper))
    return tuple((lo, hi) for lo, hi in ranges)


def step_collective_s(kind: str, nbytes: float, topo: MeshTopology, axes: tuple[str, ...] | str,
                      compute_before_s: float | None = None) -> float:
    """Seconds one collective adds to a training step: THE price of a collective in the planner (ILP edges,
    ops' inner collectives, ZeRO-1's broadcast: ``parallelizer.planner.costs``): the collective's time
    (:func:`collective_time_s`) + the wait for the slowest rank, :func:`collective_wait_s`: :func:`sync_wait_s` of the
    compute the rank ran since its previous collective (``compute_before_s``; None: unknown, the full calibrated
    ``DeviceSpec.collective_sync_s``, as the ILP prices it per edge without the program's order; 0 on the GPU
    presets), none for a collective of every rank on more ranks than cores (round 23).

    Tried and not adopted (round 18, r18d; benchmarks/RESULTS.md): with more ranks than cores, processor sharing,
    ``k / cores x`` the process CPU one rank spends in the collective (``Profile.collective_cpu``) or, without it,
    the wall fit without the sync term, and the gradient buckets exposed in full. On the idle measurements of
    run 14 (4 ranks on 2 cores) it priced FSDP plans within -9..+7% (was +34..+62%) but the free 2 x 2 plans
    further under (-38..-42%), and the llama/4 pick moved from ddp to free 2 x 2 (measured 1.37x slower): what
    separates those plans is CPU the emitted program spends beside its collectives, not the collectives' own.

    Raises:
        ValueError: as :func:`collective_time_s`.
    """
    return collective_time_s(kind, nbytes, topo, axes) + collective_wait_s(topo, axes, compute_before_s)


def collective_wait_s(topo: MeshTopology, axes: tuple[str, ...] | str, compute_before_s: float | None = None) -> float:
    """The wait of a blocking collective over mesh ``axes`` for the slowest rank, seconds: :func:`sync_wait_s` of the
    cluster's device, except 0 for a collective of EVERY rank of a cluster with more processes than cores
    (``CoreSharing.ranks_over_cores``, a calibration profile's cluster of 4 gloo ranks on 2 cores).

    Why (round 23, r23c): the calibrated wait (``cost_model.measure._measure_sync``, 4.7 ms on 4 ranks of this
    machine) is timed on an all-reduce of every rank after a compute chunk, from the last rank's entry to the last
    rank's exit. With 4 ranks on 2 cores, the ranks leave that all-reduce together and two of them take the cores
    for their next chunk while the other two wait for a core: what the last exit waits for is the others' compute,
    which the contention slowdown of every rank's compute already prices (a step of 4 ranks on 2 cores measured
    2 x rank CPU x 0.98-1.24 in the idle runs of rounds 21 and 22: the cores are busy). A collective of a sub-group
    (one tp pair of a dp=2 x tp=2 mesh, a pipeline's dp pair) runs while the other ranks compute: each of its
    steps wakes a member that must get a core held by them, a wait the calibrated one measures in kind; it keeps
    it. Priced over the 42 plans of each idle run of round 22 (the same programs, predictions only): without the
    wait on every 4-rank collective (r22g) the dp=2 x tp=2 plans dropped below the whole-world ones (mlp ddp x tp
    -24%, llama free 2x2 -16% of their measured steps) and the planner's pick on mlp/4 and llama/4 became a 2x2
    plan measured 1.06-1.24x the fastest; without it on the whole-world collectives only, median |error| 21.7 ->
    19.4% (round 21 code's run) and 11.3 -> 9.8% (round 22's), 4-rank median error +24 -> +18% and +11 -> +6%,
    Spearman 0.954 -> 0.958 and 0.979 -> 0.980, every pick kept (benchmarks/RESULTS.md, round 23 r23c).
    """
    wait = sync_wait_s(topo.cluster.device, compute_before_s)
    sharing = topo.cluster.sharing
    if wait and sharing is not None and sharing.ranks_over_cores:
        names = (axes,) if isinstance(axes, str) else tuple(axes)
        if math.prod(topo.axis_size(a) for a in names) == topo.cluster.world_size:
            return 0.0
    return wait


def sync_wait_s(device: DeviceSpec, compute_before_s: float | None = None) -> float:
    """The wait of a blocking collective for the slowest rank, seconds: ``DeviceSpec.collective_sync_s`` x
    ``min(1, compute_before_s / sync_chunk_s(device))``; the full calibrated wait when ``compute_before_s`` is None.

    The calibrated wait (``cost_model.measure._measure_sync``) is measured on a collective that follows a compute
    chunk of ``_SYNC_MATMULS`` matmuls on every rank (:func:`sync_chunk_s`: 8.6 ms priced on the 4-process device
    of this machine's profile): it is the ranks drifting apart over that compute (with 4 ranks on 2 cores, who
    gets a core when) that the last rank's entry waits for, and a collective after less compute waits
    proportionally less (a linear interpolation between no compute, no drift, and the calibrated chunk; more
    compute is capped at the calibrated wait). Round 20 (r20c), on the idle run 16 (4 gloo ranks on 2 cores):
    the wait implied per collective, (measured - priced without any wait) / collectives, was 0-1.5 ms for the
    FSDP plans, 0.7-2.2 ms of priced compute between collectives, and 1.9-5.4 ms (calibrated: 4.8) for the tp,
    ddp x tp, 2x2 and ddp plans, 3.9-29 ms between; the full wait on each of GPT-2's 159 FSDP collectives priced
    it at +86%.

    Raises:
        ValueError: a negative ``compute_before_s``.
    """
    full = device.collective_sync_s
    if compute_before_s is None or full == 0.0:
        return full
    if compute_before_s < 0:
        raise ValueError(f"sync_wait_s: compute_before_s={compute_before_s!r} must be >= 0")
    return full * min(1.0, compute_before_s / sync_chunk_s(device))


_SYNC_CHUNK: dict[int, tuple[DeviceSpec, float]] = {}


def sync_chunk_s(device: DeviceSpec) -> float:
    """Priced seconds of the compute chunk the calibrated sync wait follows (``cost_model.measure``:
    ``_SYNC_MATMULS`` fp32 ``torch.mm`` of ``_MATMUL_N`` x ``_MATMUL_N``) on ``device`` (a profile's device of n
    processes is slowed for their sharing: :meth:`cost_model.calibrate.Profile.cluster`), by
    :func:`cost_model.compute.op_cost`. Cached per device object."""
    held = _SYNC_CHUNK.get(id(device))
    if held is None or held[0] is not device:
        import torch  # imported here: pricing a collective alone needs neither torch nor cost_model.compute
        from cost_model.compute import op_cost
        from cost_model.measure import _MATMUL_N, _SYNC_MATMULS
        a = torch.empty(_MATMUL_N, _MATMUL_N, device="meta")
        one = op_cost(torch.ops.aten.mm.default, (a, a), {}, torch.empty(_MATMUL_N, _MATMUL_N, device="meta"), device)
        held = _SYNC_CHUNK[id(device)] = (device, _SYNC_MATMULS * one.fwd_s)
    return held[1]


def overlapped_comm_exposed_s(ready_s: list[float] | tuple[float, ...], comm_s: list[float] | tuple[float, ...],
                              compute_end_s: float, overlap: float = 1.0) -> float:
    """Seconds by which bucketed, asynchronous communication delays the end of a computation it overlaps.

    The formulation (DDP-style gradient buckets, ``parallelizer.rewriter.grad_sync``): bucket ``b`` becomes
    ready at ``ready_s[b]`` (seconds after backward began: the backward compute and blocking collectives that
    produce its last gradient) and its collective takes ``comm_s[b]``; the collectives run one at a time in
    bucket order on the communication thread, so bucket b finishes at
    ``finish_b = max(ready_s[b], finish_{b-1}) + comm_s[b]`` (``finish_{-1} = 0``). Backward's own work ends
    at ``compute_end_s``; the step waits for the last bucket, so the hidden schedule delays it by
    ``max(0, finish_last - compute_end_s)``. Only a fraction ``overlap`` of the communication can hide (the
    device's ``DeviceSpec.comm_overlap``: 1 when communication has its own engine, less when it competes with
    compute for the same cores); the rest is paid in full::

        exposed_s = overlap * max(0, finish_last - compute_end_s) + (1 - overlap) * sum(comm_s)

    Bounds: ``max(0, sum(comm_s) - compute_end_s) <= exposed_s <= sum(comm_s)`` for ready times within
    ``[0, compute_end_s]`` and the last bucket's ``comm_s`` is always exposed when it is ready at the end.

    Raises:
        ValueError: lengths differ, a negative time, or ``overlap`` outside [0, 1].
    """
    if len(ready_s) != len(comm_s):
        raise ValueError(f"overlapped_comm_exposed_s: {len(ready_s)} ready times but {len(comm_s)} bucket times")
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap={overlap!r}: must be a fraction in [0, 1]")
    if any(t < 0 for t in (*ready_s, *comm_s)) or compute_end_s < 0:
        raise ValueError(f"overlapped_comm_exposed_s: times must be >= 0 (ready {list(ready_s)}, comm {list(comm_s)}, "
                         f"compute_end {compute_end_s})")
    finish = 0.0
    for ready, comm in zip(ready_s, comm_s):
        finish = max(ready, finish) + comm
    return overlap * max(0.0, finish - compute_end_s) + (1 - overlap) * sum(comm_s)
