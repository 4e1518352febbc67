"""Interconnect topology: links, clusters of nodes, and a device mesh laid out on a cluster.

Link convention (used by every formula in :mod:`cost_model.communication`)
---------------------------------------------------------------------------
``Link.bandwidth_bytes_per_s`` (beta) is the **per-direction, per-GPU** bandwidth one rank can push into
a collective algorithm over that link: each rank sends at beta while receiving at beta. This is the
quantity nccl-tests' "bus bandwidth" saturates at (nccl-tests doc/PERFORMANCE.md). So an NVLink
"600 GB/s bidirectional" GPU is 300 GB/s here, and a node with one 200 Gb/s InfiniBand HCA per GPU is
25 GB/s per GPU across nodes. ``Link.latency_s`` (alpha) is the per-step latency of one message hop.

Per-collective overrides (``Link.per_kind``)
--------------------------------------------
A real library does not keep the textbook ratios between collectives (gloo's all_gather, for one, is
slower relative to its all_reduce than the ring formulas say). ``Link.per_kind`` maps a collective kind
(one of :data:`COLLECTIVE_KINDS`) to its own ``(latency_s, bandwidth_bytes_per_s)``. The rule: for that
kind the override **replaces** alpha and beta of that link; the algorithm's step and byte factors
(:func:`cost_model.communication.alpha_beta_coefficients`) still apply, so an override must be fitted in
that same factor space (as :func:`cost_model.calibrate.fit_link` does). A kind without an override uses
the link's ``latency_s`` / ``bandwidth_bytes_per_s``. The presets carry no overrides.

Size-dependent fits (``Link.size_fits``)
----------------------------------------
A measured library is not one straight line over message sizes (gloo on a shared CPU: messages of 1-64 MiB
ran 1.3-6.4x slower than a line fitted on 4 KiB-4 MiB). ``Link.size_fits`` maps a kind to a piecewise fit:
segments ``(upper_nbytes, latency_s, bandwidth_bytes_per_s)`` sorted by ``upper_nbytes``; a message of
``nbytes`` (nccl-tests convention) is priced with the first segment whose ``upper_nbytes >= nbytes``, and
beyond the last segment with the last one (its slope extrapolates). For its kind a size fit takes precedence
over ``per_kind`` and the link's own alpha/beta; the step and byte factors still apply (same factor space).

Mesh layout
-----------
Global ranks are laid out row-major over ``mesh_shape``: the LAST mesh axis varies fastest, so it is
innermost and fills a node first (as in ``torch.distributed.device_mesh.init_device_mesh``, where
``torch.arange(world).view(mesh_shape)`` assigns ranks and node ``k`` holds ranks
``[k*devices_per_node, (k+1)*devices_per_node)``). The mesh must cover the cluster exactly
(``prod(mesh_shape) == num_nodes * devices_per_node``): to plan on fewer devices, build a smaller
:class:`Cluster`.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping

from cost_model.hardware import A100_80GB, H100_SXM, H200_SXM, DeviceSpec

__all__ = ["COLLECTIVE_KINDS", "Link", "CoreSharing", "Cluster", "GroupInfo", "MeshTopology", "dgx_a100", "dgx_h100",
           "dgx_h200", "ethernet_a100", "internet_a100", "CLUSTER_PRESETS", "get_cluster"]

GB = 1e9
# The collective kinds priced by cost_model.communication (defined here so a Link can validate its
# per-kind overrides; cost_model.communication re-exports it).
COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")


def _check_alpha_beta(where: str, latency_s: object, bandwidth_bytes_per_s: object) -> None:
    if not (isinstance(latency_s, (int, float)) and not isinstance(latency_s, bool) and 0 <= latency_s < 1):
        raise ValueError(f"{where}latency_s={latency_s!r}: must be seconds in [0, 1)")
    if not (isinstance(bandwidth_bytes_per_s, (int, float)) and not isinstance(bandwidth_bytes_per_s, bool)
            and math.isfinite(bandwidth_bytes_per_s) and bandwidth_bytes_per_s > 0):
        raise ValueError(f"{where}bandwidth_bytes_per_s={bandwidth_bytes_per_s!r}: must be a finite number > 0")


@dataclass(frozen=True, slots=True)
class Link:
    """An interconnect in the alpha-beta model: a message of S bytes takes ``latency_s + S / bandwidth``.

    Attributes:
        name: label, e.g. ``"nvlink3"``.
        latency_s: alpha, seconds per message step, >= 0.
        bandwidth_bytes_per_s: beta, per-direction per-GPU bytes/s (see module docstring), > 0.
        per_kind: optional overrides ``{kind: (latency_s, bandwidth_bytes_per_s)}`` for collective kinds
            whose measured alpha/beta differ from the link's (module docstring: the override replaces
            alpha/beta for that kind; step/byte factors still apply). Default: empty (no overrides).
            Stored as a read-only mapping with sorted keys and float pairs.
        size_fits: optional piecewise fits ``{kind: ((upper_nbytes, latency_s, bandwidth_bytes_per_s), ...)}``
            (module docstring), segments sorted by ``upper_nbytes``; stored read-only as float triples.

    Raises:
        ValueError: naming the field, value and requirement (for overrides also the kind).
    """

    name: str
    latency_s: float
    bandwidth_bytes_per_s: float
    per_kind: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    size_fits: Mapping[str, tuple[tuple[float, float, float], ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_alpha_beta("Link.", self.latency_s, self.bandwidth_bytes_per_s)
        if not isinstance(self.per_kind, Mapping):
            raise ValueError(f"Link.per_kind={self.per_kind!r}: must be a mapping "
                             "{kind: (latency_s, bandwidth_bytes_per_s)}")
        overrides: dict[str, tuple[float, float]] = {}
        for kind in sorted(self.per_kind):
            if kind not in COLLECTIVE_KINDS:
                raise ValueError(f"Link.per_kind key {kind!r}: unknown collective kind; use one of {COLLECTIVE_KINDS}")
            value = self.per_kind[kind]
            if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2:
                raise ValueError(f"Link.per_kind[{kind!r}]={value!r}: must be a pair "
                                 "(latency_s, bandwidth_bytes_per_s)")
            latency_s, bandwidth_bytes_per_s = value
            _check_alpha_beta(f"Link.per_kind[{kind!r}].", latency_s, bandwidth_bytes_per_s)
            overrides[kind] = (float(latency_s), float(bandwidth_bytes_per_s))
        # Freeze (immutable, deterministic order) so the Link stays a value.
        object.__setattr__(self, "per_kind", MappingProxyType(overrides))
        object.__setattr__(self, "size_fits", MappingProxyType(_checked_size_fits(self.size_fits)))

    def __hash__(self) -> int:
        return hash((self.name, self.latency_s, self.bandwidth_bytes_per_s, tuple(self.per_kind.items()),
                     tuple(self.size_fits.items())))

    def alpha_beta(self, kind: str, nbytes: float | None = None) -> tuple[float, float]:
        """``(latency_s, bandwidth_bytes_per_s)`` to price ``kind`` (a message of ``nbytes``) on this link: the
        size fit's segment for ``nbytes`` if the kind has one and ``nbytes`` is given, else the kind's override
        if any, else the link's own (module docstring).

        Raises:
            ValueError: unknown ``kind``; lists the valid kinds.
        """
        if kind not in COLLECTIVE_KINDS:
            raise ValueError(f"unknown collective kind {kind!r}; use one of {COLLECTIVE_KINDS}")
        segments = self.size_fits.get(kind)
        if segments and nbytes is not None:
            upper, latency_s, bandwidth = next((seg for seg in segments if nbytes <= seg[0]), segments[-1])
            return latency_s, bandwidth
        return self.per_kind.get(kind, (self.latency_s, self.bandwidth_bytes_per_s))


def _checked_size_fits(size_fits: object) -> dict[str, tuple[tuple[float, float, float], ...]]:
    """`Link.size_fits` validated and normalised (sorted kinds, float triples); raises ValueError naming the entry."""
    if not isinstance(size_fits, Mapping):
        raise ValueError(f"Link.size_fits={size_fits!r}: must be a mapping {{kind: ((upper_nbytes, latency_s, "
                         "bandwidth_bytes_per_s), ...)}}")
    out: dict[str, tuple[tuple[float, float, float], ...]] = {}
    for kind in sorted(size_fits):
        if kind not in COLLECTIVE_KINDS:
            raise ValueError(f"Link.size_fits key {kind!r}: unknown collective kind; use one of {COLLECTIVE_KINDS}")
        segments = []
        for i, seg in enumerate(size_fits[kind]):
            if isinstance(seg, (str, bytes)) or not hasattr(seg, "__len__") or len(seg) != 3:
                raise ValueError(f"Link.size_fits[{kind!r}][{i}]={seg!r}: must be (upper_nbytes, latency_s, "
                                 "bandwidth_bytes_per_s)")
            upper, latency_s, bandwidth = seg
            if not (isinstance(upper, (int, float)) and upper > 0):
                raise ValueError(f"Link.size_fits[{kind!r}][{i}].upper_nbytes={upper!r}: must be a number > 0")
            _check_alpha_beta(f"Link.size_fits[{kind!r}][{i}].", latency_s, bandwidth)
            segments.append((float(upper), float(latency_s), float(bandwidth)))
        if not segments or [s[0] for s in segments] != sorted({s[0] for s in segments}):
            raise ValueError(f"Link.size_fits[{kind!r}]: needs >= 1 segment with strictly increasing upper_nbytes, "
                             f"got {[s[0] for s in segments]}")
        out[kind] = tuple(segments)
    return out


def _slowdown_points(where: str, points: object) -> tuple[tuple[int, float], ...]:
    """``((k, factor), ...)`` validated (k an int >= 1, each once; factor finite > 0) and sorted by k."""
    if isinstance(points, Mapping):
        points = tuple(points.items())
    out: dict[int, float] = {}
    for item in points:  # type: ignore[union-attr]
        if isinstance(item, (str, bytes)) or not hasattr(item, "__len__") or len(item) != 2:
            raise ValueError(f"{where}: entry {item!r} must be a pair (processes, factor)")
        k, factor = item
        if not (isinstance(k, int) and not isinstance(k, bool) and k >= 1) or k in out:
            raise ValueError(f"{where}: process count {k!r} must be an int >= 1, given once")
        if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
            raise ValueError(f"{where}[{k}]={factor!r}: must be a finite slowdown > 0")
        out[k] = float(factor)
    return tuple(sorted(out.items()))


@dataclass(frozen=True, slots=True)
class CoreSharing:
    """The devices of a :class:`Cluster` are processes sharing one machine's cores (a calibration profile's
    cluster, :meth:`cost_model.calibrate.Profile.cluster`): each of k processes computing at once runs
    ``factor(k)`` times slower than alone, and a process that waits leaves the cores to the others. The
    planner's pipeline search prices its schedules with that (processor sharing, ``planner.sharing``); the
    cost model itself reads nothing here. ``None`` on every GPU preset (one device per rank).

    Attributes:
        compute_slowdown: ``((k, factor), ...)`` sorted by k: the measured slowdown of each of k concurrent
            processes in compute (the matmul column of ``Profile.contention``); k = 1 (alone) may be left out
            (it is 1). The planner interpolates between the points (``planner.sharing.SharedCores.measured``).
        optimizer_slowdown: the same for the optimizer step (``Profile.contention``'s optimizer column), or
            ``()`` when not measured (then ``compute_slowdown``).
        applied_compute: the compute factor ``Cluster.device`` is already slowed by (``DeviceSpec.scaled``
            with the matmul column at the cluster's process count; 1.0 when that count was not measured), so
            ``price / applied_compute`` is a price at solo speed.
        collective_cpu: ``((kind, seconds_per_call, seconds_per_byte), ...)``: the process CPU one rank spends in
            a collective of that kind at the cluster's process count (``Profile.collective_cpu``, round 18), or
            ``()`` when not measured. The pipeline search counts the dp gradient sync's CPU with it in its floor
            of the ranks' CPU over the cores (round 21, ``planner.sharing.cpu_floor_s``).
        ranks_over_cores: the cluster has more processes than the machine has cores (4 gloo ranks on 2 cores):
            then a collective of every rank waits for no straggler beyond the compute slowdown, and only a
            collective of a sub-group pays ``DeviceSpec.collective_sync_s``
            (:func:`cost_model.communication.collective_wait_s`, round 23).

    Raises:
        ValueError: a point that is not (an int >= 1 given once, a finite factor > 0), no compute point, or an
            applied factor that is not finite > 0; names the entry.
    """

    compute_slowdown: tuple[tuple[int, float], ...]
    optimizer_slowdown: tuple[tuple[int, float], ...] = ()
    applied_compute: float = 1.0
    collective_cpu: tuple[tuple[str, float, float], ...] = ()
    ranks_over_cores: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.ranks_over_cores, bool):
            raise ValueError(f"CoreSharing.ranks_over_cores={self.ranks_over_cores!r}: must be a bool (more processes "
                             "than cores)")
        object.__setattr__(self, "compute_slowdown",
                           _slowdown_points("CoreSharing.compute_slowdown", self.compute_slowdown))
        object.__setattr__(self, "optimizer_slowdown",
                           _slowdown_points("CoreSharing.optimizer_slowdown", self.optimizer_slowdown))
        if not self.compute_slowdown:
            raise ValueError("CoreSharing.compute_slowdown is empty: give >= 1 point (processes, slowdown)")
        a = self.applied_compute
        if not (isinstance(a, (int, float)) and math.isfinite(a) and a > 0):
            raise ValueError(f"CoreSharing.applied_compute={a!r}: must be a finite factor > 0")
        for entry in self.collective_cpu:
            if not (len(entry) == 3 and isinstance(entry[0], str)
                    and all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for x in entry[1:])):
                raise ValueError(f"CoreSharing.collective_cpu entry {entry!r}: need (kind, seconds per call >= 0, "
                                 "seconds per byte >= 0)")

    def collective_cpu_s(self, kind: str, nbytes: float) -> float:
        """Process CPU seconds of one rank in one collective of `kind` over `nbytes` bytes (`collective_cpu`'s
        line; 0 when the kind was not measured)."""
        return next((a + b * nbytes for k, a, b in self.collective_cpu if k == kind), 0.0)


@dataclass(frozen=True, slots=True)
class Cluster:
    """``num_nodes`` identical nodes of ``devices_per_node`` devices; ``sharing``: set when the devices are
    processes sharing one machine's cores (:class:`CoreSharing`, a calibration profile's cluster), else None.

    Raises:
        ValueError: non-positive counts; names the field and value.
    """

    device: DeviceSpec
    num_nodes: int
    devices_per_node: int
    intra_node_link: Link
    inter_node_link: Link
    sharing: CoreSharing | None = None

    def __post_init__(self) -> None:
        for field_name in ("num_nodes", "devices_per_node"):
            value = getattr(self, field_name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"Cluster.{field_name}={value!r}: must be an int >= 1")
        if self.sharing is not None and not isinstance(self.sharing, CoreSharing):
            raise ValueError(f"Cluster.sharing={self.sharing!r}: must be a CoreSharing or None")

    @property
    def world_size(self) -> int:
        """Total number of devices, ``num_nodes * devices_per_node``."""
        return self.num_nodes * self.devices_per_node


# Per-step latencies follow NCCL's tuning model (NVIDIA/nccl src/graph/tuning.cc, table hwLat, Ring/LL128
# protocol): NVLink 1.9 us, network 4.0 us per ring step. Measured values differ; calibrate to refine.
_NVLINK_LATENCY_S = 1.9e-6
_IB_LATENCY_S = 4.0e-6


def _dgx(device: DeviceSpec, num_nodes: int, nvlink_bidir_gb_per_s: float, ib_gbit_per_s: float,
         devices_per_node: int, nvlink_name: str, ib_name: str) -> Cluster:
    return Cluster(
        device=device,
        num_nodes=num_nodes,
        devices_per_node=devices_per_node,
        intra_node_link=Link(nvlink_name, _NVLINK_LATENCY_S, nvlink_bidir_gb_per_s / 2 * GB),
        # One HCA per GPU: ib_gbit_per_s / 8 bytes per second per direction per GPU.
        inter_node_link=Link(ib_name, _IB_LATENCY_S, ib_gbit_per_s / 8 * GB),
    )


def dgx_a100(num_nodes: int, devices_per_node: int = 8, device: DeviceSpec = A100_80GB) -> Cluster:
    """DGX A100 nodes (NVIDIA DGX A100 datasheet / User Guide): 8x A100 SXM, NVLink3 600 GB/s
    bidirectional per GPU (-> 300 GB/s per direction), 8x 200 Gb/s HDR InfiniBand ConnectX-6 (one per
    GPU -> 25 GB/s per GPU per direction). Default device: the 640GB system's A100 80GB."""
    return _dgx(device, num_nodes, 600, 200, devices_per_node, "nvlink3", "ib_hdr_200g")


def dgx_h100(num_nodes: int, devices_per_node: int = 8, device: DeviceSpec = H100_SXM) -> Cluster:
    """DGX H100 nodes (NVIDIA DGX H100 datasheet): 8x H100 SXM, NVLink4 900 GB/s bidirectional per GPU
    (-> 450 GB/s per direction), 8x 400 Gb/s NDR InfiniBand ConnectX-7 (-> 50 GB/s per GPU per direction)."""
    return _dgx(device, num_nodes, 900, 400, devices_per_node, "nvlink4", "ib_ndr_400g")


def dgx_h200(num_nodes: int, devices_per_node: int = 8, device: DeviceSpec = H200_SXM) -> Cluster:
    """DGX H200 nodes (NVIDIA DGX H200 datasheet): 8x H200 SXM, NVLink4 900 GB/s bidirectional per GPU
    (-> 450 GB/s per direction), 8x 400 Gb/s NDR InfiniBand ConnectX-7 (-> 50 GB/s per GPU per direction)."""
    return _dgx(device, num_nodes, 900, 400, devices_per_node, "nvlink4", "ib_ndr_400g")


# Slow-link clusters. Nodes keep their NVLink inside (DGX A100 figures above); only the network between nodes
# differs. Per-GPU convention of the module docstring: a node's one NIC is shared by its GPUs, so each GPU gets
# NIC / devices_per_node per direction when all of them cross the network at once (a collective over every GPU).
_ETHERNET_GBIT_PER_S = 25.0
"""25 GbE, one NIC per node: the common cloud instance network below 100 Gb/s (e.g. AWS p3.8xlarge, 4x V100,
"10 Gigabit"; p3.16xlarge "25 Gigabit", AWS EC2 instance-type specifications)."""
_ETHERNET_LATENCY_S = 25e-6
"""TCP over a datacenter Ethernet hop without RDMA: 25 us per message, an assumption of the order of a kernel
TCP round trip on 10/25 GbE (several times InfiniBand's 4 us above). Calibrate (`python -m parallelizer
calibrate`) to replace it with a measurement."""
_INTERNET_MBIT_PER_S = 100.0
"""Nodes in different sites over the public internet: 100 Mb/s per node, the order of the 80 Mb/s links over
which Protocol Models (Ramasinghe et al., arXiv 2506.01260, Sec. 5) train, and the lower end of the
100 Mb/s - 1 Gb/s range of business fibre uplinks."""
_INTERNET_LATENCY_S = 0.03
"""30 ms one way: the order of a round trip inside a continent (Verizon Enterprise "IP latency statistics": ~30-45 ms
monthly average round trip within North America / Europe, ~70-80 ms transatlantic)."""


def ethernet_a100(num_nodes: int, devices_per_node: int = 8, device: DeviceSpec = A100_80GB) -> Cluster:
    """A100 nodes (NVLink3 inside, as :func:`dgx_a100`) networked by one 25 GbE NIC per node (no RDMA): the
    inter-node link gives each GPU 25 Gb/s / devices_per_node per direction, 25 us latency (sources at the
    constants)."""
    intra = Link("nvlink3", _NVLINK_LATENCY_S, 600 / 2 * GB)
    inter = Link("ethernet_25g", _ETHERNET_LATENCY_S, _ETHERNET_GBIT_PER_S / 8 * GB / devices_per_node)
    return Cluster(device, num_nodes, devices_per_node, intra, inter)


def internet_a100(num_nodes: int, devices_per_node: int = 1, device: DeviceSpec = A100_80GB) -> Cluster:
    """A100 nodes in different sites over the internet: 100 Mb/s per node (shared by its GPUs), 30 ms latency
    (sources at the constants); NVLink3 inside a node. Typical use: ``"internet:8x1"``, 8 single-GPU nodes."""
    intra = Link("nvlink3", _NVLINK_LATENCY_S, 600 / 2 * GB)
    inter = Link("internet_100m", _INTERNET_LATENCY_S, _INTERNET_MBIT_PER_S / 8 * 1e6 / devices_per_node)
    return Cluster(device, num_nodes, devices_per_node, intra, inter)


CLUSTER_PRESETS: dict[str, Callable[..., Cluster]] = {"a100": dgx_a100, "h100": dgx_h100, "h200": dgx_h200,
                                                     "ethernet": ethernet_a100, "internet": internet_a100}
"""Preset name -> builder ``(num_nodes, devices_per_node=...) -> Cluster``. Links per level differ (intra-node
vs inter-node); for other figures per level build a :class:`Cluster` with your own :class:`Link` s, or measure
them into a calibration profile (`cost_model.calibrate`), which ``--cluster PATH.json`` accepts."""
_CLUSTER_SPEC = re.compile(r"^(?P<preset>[a-z0-9_]+):(?P<nodes>\d+)x(?P<devices>\d+)$")


def get_cluster(spec: str) -> Cluster:
    """Parse ``"PRESET:NODESxDEVICES"``, e.g. ``"h100:2x8"`` = 2 DGX H100 nodes using 8 GPUs each, or
    ``"internet:8x1"`` = 8 single-A100 nodes over 100 Mb/s internet links (:data:`CLUSTER_PRESETS`).

    Raises:
        ValueError: malformed string, unknown preset, or devices per node outside 1..8; says the format.
    """
    match = _CLUSTER_SPEC.match(spec.strip().lower())
    remedy = f"use 'PRESET:NODESxDEVICES' with PRESET in {sorted(CLUSTER_PRESETS)}, e.g. 'h100:2x8'"
    if match is None:
        raise ValueError(f"cannot parse cluster {spec!r}: {remedy}")
    preset = match["preset"].removeprefix("dgx_")
    if preset not in CLUSTER_PRESETS:
        raise ValueError(f"unknown cluster preset {match['preset']!r}: {remedy}")
    nodes, devices = int(match["nodes"]), int(match["devices"])
    if nodes < 1 or not 1 <= devices <= 8:
        raise ValueError(f"cluster {spec!r}: nodes hold 1..8 devices and need >= 1 node; {remedy}")
    return CLUSTER_PRESETS[preset](nodes, devices_per_node=devices)


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """How one process group (the ranks varying along some mesh axes) sits on the cluster.

    Attributes:
        size: ranks in the group (product of the axes' sizes).
        ranks_per_node: g, group members that share a node (uniform over the group's nodes).
        num_nodes: m, nodes the group spans; ``size == ranks_per_node * num_nodes``.
    """

    size: int
    ranks_per_node: int
    num_nodes: int


@dataclass(frozen=True, slots=True)
class MeshTopology:
    """A named device mesh on a :class:`Cluster` (row-major, last axis innermost; see module docstring).

    Raises:
        ValueError: shape/names mismatch, non-positive sizes, duplicate names, or a mesh that does not
            cover the cluster exactly; and from :meth:`group_info` for unknown axis names.
    """

    cluster: Cluster
    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...]

    def __post_init__(self) -> None:
        shape, names = tuple(self.mesh_shape), tuple(self.axis_names)
        object.__setattr__(self, "mesh_shape", shape)
        object.__setattr__(self, "axis_names", names)
        if len(shape) != len(names) or not shape:
            raise ValueError(f"mesh_shape={shape} and axis_names={names}: need one name per axis, >= 1 axis")
        if any(not isinstance(n, int) or n < 1 for n in shape):
            raise ValueError(f"mesh_shape={shape}: every axis size must be an int >= 1")
        if len(set(names)) != len(names):
            raise ValueError(f"axis_names={names}: names must be unique")
        if math.prod(shape) != self.cluster.world_size:
            raise ValueError(
                f"mesh {dict(zip(names, shape))} has {math.prod(shape)} devices but the cluster has "
                f"{self.cluster.num_nodes} nodes x {self.cluster.devices_per_node} = {self.cluster.world_size}; "
                f"make the mesh's axis sizes multiply to {self.cluster.world_size}, or plan on {math.prod(shape)} "
                f"devices: {_fewer_devices_remedy(self.cluster, math.prod(shape))}"
            )

    def axis_size(self, axis_name: str) -> int:
        """Size of one mesh axis. Raises ValueError for an unknown name."""
        return self.mesh_shape[self._index(axis_name)]

    def axis_info(self, axis_name: str) -> GroupInfo:
        """:class:`GroupInfo` of the groups along one mesh axis. Raises ValueError for an unknown name."""
        return self.group_info((axis_name,))

    def group_info(self, axes: tuple[str, ...] | str) -> GroupInfo:
        """:class:`GroupInfo` of the groups varying along all ``axes`` together (size = product).

        If the groups' members are spread unevenly over nodes (possible when axis sizes do not divide
        ``devices_per_node``), the group is reported as ``ranks_per_node=1, num_nodes=size``: every hop is
        priced on the inter-node link, a pessimistic but safe bound.

        Raises:
            ValueError: unknown or repeated axis name; names the mesh and its axes.
        """
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        indices = tuple(sorted(self._index(a) for a in axes))
        if len(set(indices)) != len(indices):
            raise ValueError(f"axes {axes}: each mesh axis may appear once")
        return _group_info(self.mesh_shape, indices, self.cluster.devices_per_node)

    def _index(self, axis_name: str) -> int:
        try:
            return self.axis_names.index(axis_name)
        except ValueError:
            mesh = dict(zip(self.axis_names, self.mesh_shape))
            raise ValueError(f"unknown mesh axis {axis_name!r} for mesh {mesh}; use one of {self.axis_names}") from None


@functools.lru_cache(maxsize=1024)
def _group_info(mesh_shape: tuple[int, ...], axis_indices: tuple[int, ...], devices_per_node: int) -> GroupInfo:
    size = math.prod(mesh_shape[i] for i in axis_indices)
    strides = [math.prod(mesh_shape[i + 1:]) for i in range(len(mesh_shape))]
    # Offsets of a group's members relative to its first rank, and first ranks of all groups.
    offsets = [0]
    for i in axis_indices:
        offsets = [o + k * strides[i] for o in offsets for k in range(mesh_shape[i])]
    others = [i for i in range(len(mesh_shape)) if i not in axis_indices]
    starts = [0]
    for i in others:
        starts = [s + k * strides[i] for s in starts for k in range(mesh_shape[i])]
    ranks_per_node_seen: set[int] = set()
    for start in starts:
        per_node: dict[int, int] = {}
        for offset in offsets:
            node = (start + offset) // devices_per_node
            per_node[node] = per_node.get(node, 0) + 1
        ranks_per_node_seen.update(per_node.values())
        if len(ranks_per_node_seen) > 1:  # uneven spread: price every hop as inter-node
            return GroupInfo(size=size, ranks_per_node=1, num_nodes=size)
    (ranks_per_node,) = ranks_per_node_seen
    return GroupInfo(size=size, ranks_per_node=ranks_per_node, num_nodes=size // ranks_per_node)


def _fewer_devices_remedy(cluster: Cluster, devices: int) -> str:
    """How to name a cluster of `devices` devices like `cluster` (MeshTopology's mesh/cluster mismatch error)."""
    per_node = min(devices, cluster.devices_per_node)
    if devices % per_node:
        return ("no whole number of its nodes holds that many; choose a mesh of whole nodes, or a cluster of "
                "nodes that divide it")
    shape = f"{devices // per_node}x{per_node}"
    return (f"a cluster of {shape} (CLI: --cluster PRESET:{shape}, e.g. h100:{shape}, or leave --cluster out to get "
            f"nodes holding the mesh; Python: dataclasses.replace(cluster, num_nodes={devices // per_node}, "
            f"devices_per_node={per_node}))")
