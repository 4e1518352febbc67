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

Groups spanning nodes (g ranks per node, m nodes, n = g*m) use the hierarchical algorithm:
all_reduce = reduce-scatter inside the node (g ranks, nbytes) + all_reduce across nodes on nbytes/g
(m ranks, inter-node link; the g local ranks run their m-rank all-reduces in parallel, one NIC each)
+ all-gather inside the node. all_gather = cross-node all-gather producing nbytes/g, then intra-node
all-gather to nbytes; reduce_scatter is its mirror. all_to_all sends (g-1)/n of the buffer over the
intra-node link and (n-g)/n over the inter-node link (one message per peer). broadcast = a cross-node
then an intra-node broadcast. send_recv between neighbours of a group that spans nodes is priced on
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

import math

from cost_model.topology import COLLECTIVE_KINDS, Link, MeshTopology

__all__ = ["COLLECTIVE_KINDS", "ALGORITHMS", "alpha_beta_coefficients", "flat_collective_time_s",
           "collective_time_s", "overlapped_comm_exposed_s"]

ALGORITHMS = ("ring", "tree")


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
    A group inside one node is priced flat on the intra-node link; a group spanning nodes uses the
    two-level algorithm of the module docstring. Each (phase) collective uses its link's per-kind
    override when the link has one for that kind (module docstring). ``algorithm`` applies to the cross-node all-reduce /
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
    if kind == "all_reduce":
        return (flat_collective_time_s("reduce_scatter", nbytes, g, intra)
                + flat_collective_time_s("all_reduce", nbytes / g, m, inter, algorithm)
                + flat_collective_time_s("all_gather", nbytes, g, intra))
    if kind in ("all_gather", "reduce_scatter"):
        return (flat_collective_time_s(kind, nbytes / g, m, inter)
                + flat_collective_time_s(kind, nbytes, g, intra))
    if kind == "all_to_all":
        (intra_alpha, intra_beta), (inter_alpha, inter_beta) = intra.alpha_beta(kind, nbytes), inter.alpha_beta(kind, nbytes)
        return ((g - 1) * (intra_alpha + nbytes / n / intra_beta)
                + (n - g) * (inter_alpha + nbytes / n / inter_beta))
    if kind == "broadcast":
        return (flat_collective_time_s("broadcast", nbytes, m, inter, algorithm)
                + flat_collective_time_s("broadcast", nbytes, g, intra, algorithm))
    return flat_collective_time_s("send_recv", nbytes, 2, inter)


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
