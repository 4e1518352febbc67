"""Measure this machine and turn the measurements into a :class:`Profile` (a "cpu" DeviceSpec + Links).

What is measured (the best of repeated runs after warm-up: on a shared machine, the least disturbed):

Compute is measured with one intra-op thread (:func:`calibration_threads`), like one gloo rank.

* matmul FLOP/s: fp32 ``torch.mm`` of n x n matrices for a few n; FLOPs = 2 n^3 (flop_counter's mm
  formula); the median rate over the sizes becomes ``peak_flops_per_s[float32]`` with
  ``matmul_efficiency = 1`` (the rate is already achievable, not a datasheet peak).
* memory bandwidth: ``torch.add(a, b, out=c)`` on large fp32 tensors, bytes = 3 x tensor bytes (two
  reads, one write; the STREAM "add" kernel, McCalpin 1995); ``memory_efficiency = 1``.
* launch overhead: ``torch.add`` on one-element tensors (the fixed cost of dispatching one op).
* collectives: all_reduce and all_gather over gloo with ``nprocs`` processes (spawned, one thread each),
  for several message sizes. alpha and beta are fitted jointly by least squares on relative error to
  ``t = steps * alpha + factor * nbytes / beta`` using exactly the coefficients of
  :func:`cost_model.communication.alpha_beta_coefficients` (ring), so the fitted Link reproduces the
  measurements through :func:`cost_model.collective_time_s`.
* per-kind overrides: gloo does not keep the textbook ratio between its all_gather and its all_reduce
  (its all_gather is relatively slower), so one joint alpha/beta misprices both. alpha/beta are therefore
  also fitted per measured kind, in the same factor space (same ring coefficients, same relative-error
  least squares, one kind's samples at a time), and stored as ``Link.per_kind`` overrides, which
  :func:`cost_model.collective_time_s` uses for that kind (rule in :mod:`cost_model.topology`). The joint
  fit stays the link's own alpha/beta and prices the kinds without an override (all_to_all, broadcast,
  send_recv). reduce_scatter is not measured by default: it **reuses all_gather's fit**
  (:data:`REUSED_KIND_FITS`; ring reduce_scatter is all_gather's mirror, same steps and bytes factor);
  pass ``kinds=(..., "reduce_scatter")`` to :func:`calibrate` to measure and fit it instead.

The profile JSON has sorted keys. Format version 2 adds the optional ``per_kind`` object to each link
(``{kind: {"latency_s", "bandwidth_bytes_per_s"}}``); version-1 files (no overrides) still load. ``python -m cost_model.calibrate -o profile.json`` writes one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from tqdm import tqdm

from cost_model.communication import alpha_beta_coefficients
from cost_model.hardware import DeviceSpec
from cost_model.topology import Cluster, Link

__all__ = ["Profile", "calibrate", "load_profile", "time_callable_s", "calibration_threads", "measure_collectives", "fit_link",
           "DEFAULT_MESSAGE_SIZES_BYTES", "CALIBRATED_KINDS", "MEASURABLE_KINDS", "REUSED_KIND_FITS"]

PROFILE_FORMAT_VERSION = 2
_READABLE_FORMAT_VERSIONS = (1, 2)  # version 1: links without per_kind overrides
DEFAULT_MESSAGE_SIZES_BYTES = (1 << 12, 1 << 15, 1 << 18, 1 << 20, 1 << 22)
DEFAULT_MATMUL_SIZES = (512, 1024, 2048)
CALIBRATED_KINDS = ("all_reduce", "all_gather")
MEASURABLE_KINDS = ("all_reduce", "all_gather", "reduce_scatter")
# A kind that is not measured borrows the per-kind fit of its mirror (same ring steps and bytes factor).
REUSED_KIND_FITS = {"reduce_scatter": "all_gather"}
_WORKER_TIMEOUT_S = 60
CALIBRATION_NUM_THREADS = 1


@dataclass(frozen=True, slots=True)
class Profile:
    """A calibration result: the CPU as a device, and a fitted Link per process count (joint alpha/beta plus
    per-kind overrides in ``Link.per_kind``, see the module docstring)."""

    device: DeviceSpec
    links: Mapping[int, Link]

    def cluster(self, nprocs: int) -> Cluster:
        """A Cluster of 1 node x ``nprocs`` devices whose intra- and inter-node links are the fitted one.

        Raises:
            ValueError: ``nprocs`` was not calibrated; lists the calibrated counts.
        """
        if nprocs not in self.links:
            raise ValueError(f"no link calibrated for nprocs={nprocs}; calibrated: {sorted(self.links)}. "
                             f"Remedy: calibrate(nprocs=({nprocs},))")
        link = self.links[nprocs]
        return Cluster(self.device, num_nodes=1, devices_per_node=nprocs, intra_node_link=link, inter_node_link=link)


def time_callable_s(fn: Callable[[], object], repeats: int = 10, warmup: int = 2) -> float:
    """Best (minimum) wall-clock seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs.

    The minimum, not the median: on a shared machine it is the run least disturbed by other processes.
    """
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return min(samples)


@contextlib.contextmanager
def calibration_threads(num_threads: int = CALIBRATION_NUM_THREADS) -> Iterator[None]:
    """Run the body with ``torch.set_num_threads(num_threads)``, restoring the previous value after.

    Calibration measures one intra-op thread because each gloo rank runs one thread (and a single thread
    avoids OpenMP barrier stalls when other processes share the cores)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _measure_matmul_flops_per_s(sizes: Sequence[int]) -> float:
    rates = []
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        seconds = time_callable_s(lambda: torch.mm(a, b), repeats=3 if n >= 2048 else 7)
        rates.append(2 * n**3 / seconds)
    return statistics.median(rates)


def _measure_memory_bytes_per_s(numel: int) -> float:
    a, b, c = torch.randn(numel), torch.randn(numel), torch.empty(numel)
    seconds = time_callable_s(lambda: torch.add(a, b, out=c), repeats=10)
    return 3 * numel * a.element_size() / seconds


def _measure_launch_overhead_s() -> float:
    a, b = torch.ones(1), torch.ones(1)
    return time_callable_s(lambda: torch.add(a, b), repeats=2000, warmup=200)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _collective_worker(rank: int, world_size: int, port: int, kinds: tuple[str, ...],
                       sizes_bytes: tuple[int, ...], repeats: int, inner: int, queue) -> None:
    """Spawned worker: time each (kind, size) on rank 0 and put the results on ``queue``.

    One sample = ``inner`` back-to-back collectives after a barrier, divided by ``inner`` (amortises the
    barrier skew); the result is the minimum of ``repeats`` samples (least disturbed by other processes)."""
    import torch.distributed as dist
    try:
        torch.set_num_threads(1)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=_WORKER_TIMEOUT_S))
        results: dict[str, dict[int, float]] = {}
        for kind in kinds:
            results[kind] = {}
            for nbytes in sizes_bytes:
                numel = max(1, nbytes // 4)
                if kind == "all_reduce":
                    buf = torch.ones(numel)
                    op = lambda: dist.all_reduce(buf)  # noqa: E731
                elif kind == "all_gather":  # nbytes is the OUTPUT size (nccl-tests convention)
                    out = torch.empty(numel - numel % world_size or world_size)
                    inp = torch.ones(out.numel() // world_size)
                    op = lambda: dist.all_gather_single(out, inp)  # noqa: E731
                else:  # reduce_scatter: nbytes is the INPUT size (nccl-tests convention)
                    inp = torch.ones(numel - numel % world_size or world_size)
                    out = torch.empty(inp.numel() // world_size)
                    op = lambda: dist.reduce_scatter_single(out, inp)  # noqa: E731
                op()  # warm-up (connection set-up, allocation)
                samples = []
                for _ in range(repeats):
                    dist.barrier()
                    start = time.perf_counter()
                    for _ in range(inner):
                        op()
                    samples.append((time.perf_counter() - start) / inner)
                results[kind][nbytes] = min(samples)
        if rank == 0:
            queue.put(("ok", results))
        dist.barrier()
        dist.destroy_process_group()
    except Exception as exc:  # reported to the parent, which raises
        queue.put(("error", f"rank {rank}: {type(exc).__name__}: {exc}"))
    finally:
        os._exit(0)


def measure_collectives(nprocs: int, kinds: Sequence[str] = CALIBRATED_KINDS,
                        sizes_bytes: Sequence[int] = DEFAULT_MESSAGE_SIZES_BYTES,
                        repeats: int = 15, inner: int = 1) -> dict[str, dict[int, float]]:
    """Best-of-``repeats`` seconds of each collective ``kind`` and size (bytes, nccl-tests convention) over gloo.

    Spawns ``nprocs`` processes (``torch.multiprocessing`` spawn context) on 127.0.0.1.

    Raises:
        ValueError: a kind outside :data:`MEASURABLE_KINDS`.
        RuntimeError: a worker failed or no result arrived within the worker timeout (60 s); names the rank.
    """
    unknown = [k for k in kinds if k not in MEASURABLE_KINDS]
    if unknown:
        raise ValueError(f"cannot measure collective kinds {unknown}; measurable: {MEASURABLE_KINDS}")
    ctx = torch.multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_collective_worker,
                         args=(rank, nprocs, port, tuple(kinds), tuple(sizes_bytes), repeats, inner, queue))
             for rank in range(nprocs)]
    for proc in procs:
        proc.start()
    try:
        status, payload = queue.get(timeout=_WORKER_TIMEOUT_S + 30)
    except Exception as exc:
        raise RuntimeError(f"gloo calibration with {nprocs} processes produced no result in time") from exc
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    if status != "ok":
        raise RuntimeError(f"gloo calibration with {nprocs} processes failed: {payload}")
    return payload


def _fit_alpha_beta(samples: Sequence[tuple[str, int, float, float]], what: str) -> tuple[float, float]:
    """``(alpha_s, beta_bytes_per_s)`` minimising relative error of ``steps*alpha + factor*nbytes/beta``."""
    rows = np.array([[alpha_beta_coefficients(kind, n)[0], alpha_beta_coefficients(kind, n)[1] * nbytes]
                     for kind, n, nbytes, _ in samples], dtype=float)
    seconds = np.array([s for *_, s in samples], dtype=float)
    weighted = rows / seconds[:, None]
    (alpha, inv_beta), *_ = np.linalg.lstsq(weighted, np.ones(len(samples)), rcond=None)
    if alpha < 0:  # refit bandwidth only
        alpha = 0.0
        inv_beta = float(np.linalg.lstsq(weighted[:, 1:], np.ones(len(samples)), rcond=None)[0][0])
    if inv_beta <= 0:
        raise ValueError(f"{what}: fitted a non-positive inverse bandwidth {inv_beta}: measurements are too "
                         "noisy; use larger message sizes or more repeats")
    return float(alpha), float(1 / inv_beta)


def fit_link(samples: Sequence[tuple[str, int, float, float]], name: str = "fitted", per_kind: bool = False) -> Link:
    """Least-squares alpha/beta from ``(kind, num_ranks, nbytes, seconds)`` samples (ring coefficients).

    Minimises relative error, so small and large messages weigh alike; alpha is clamped at >= 0.
    The link's own alpha/beta are the joint fit over all samples.

    Args:
        per_kind: also fit each kind separately (same coefficients, so in the factor space
            :func:`cost_model.collective_time_s` prices it) and store the fits as ``Link.per_kind``
            overrides; a kind of :data:`REUSED_KIND_FITS` that was not measured (reduce_scatter) gets a copy
            of its mirror's fit (all_gather). A kind needs samples at >= 2 message sizes.

    Raises:
        ValueError: fewer than 2 samples (per kind with ``per_kind``), or the joint fit gives no positive
            bandwidth (a per-kind fit that does is dropped with a warning: the joint fit prices that kind).
    """
    if len(samples) < 2:
        raise ValueError(f"fit_link needs >= 2 samples, got {len(samples)}; measure more message sizes")
    alpha, beta = _fit_alpha_beta(samples, f"link {name!r}")
    overrides: dict[str, tuple[float, float]] = {}
    if per_kind:
        kinds = sorted({kind for kind, *_ in samples})
        for kind in kinds:
            kind_samples = [s for s in samples if s[0] == kind]
            if len({(n, nbytes) for _, n, nbytes, _ in kind_samples}) < 2:
                raise ValueError(f"fit_link(per_kind=True): kind {kind!r} has samples at "
                                 f"{len(kind_samples)} size(s); measure >= 2 message sizes per kind")
            try:
                overrides[kind] = _fit_alpha_beta(kind_samples, f"link {name!r} kind {kind!r}")
            except ValueError as err:  # too noisy for a fit of its own: the joint fit prices this kind
                warnings.warn(f"{err}; kind {kind!r} is priced with the joint fit of link {name!r}", stacklevel=2)
        for kind, mirror in REUSED_KIND_FITS.items():
            if kind not in overrides and mirror in overrides:
                overrides[kind] = overrides[mirror]
    return Link(name=name, latency_s=alpha, bandwidth_bytes_per_s=beta, per_kind=overrides)


def _profile_to_json(profile: Profile, measurements: dict) -> dict:
    dev = profile.device
    return {
        "format_version": PROFILE_FORMAT_VERSION,
        "torch_version": torch.__version__,
        "num_threads": CALIBRATION_NUM_THREADS,
        "device": {
            "name": dev.name,
            "peak_flops_per_s": {str(k).removeprefix("torch."): v for k, v in dev.peak_flops_per_s.items()},
            "hbm_bytes": dev.hbm_bytes, "hbm_bytes_per_s": dev.hbm_bytes_per_s,
            "matmul_efficiency": dev.matmul_efficiency, "memory_efficiency": dev.memory_efficiency,
            "launch_overhead_s": dev.launch_overhead_s,
        },
        "links": {str(n): _link_to_json(link) for n, link in profile.links.items()},
        "measurements": measurements,
    }


def _link_to_json(link: Link) -> dict:
    out = {"name": link.name, "latency_s": link.latency_s, "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s}
    if link.per_kind:
        out["per_kind"] = {kind: {"latency_s": alpha, "bandwidth_bytes_per_s": beta}
                           for kind, (alpha, beta) in link.per_kind.items()}
    return out


def _link_from_json(spec: dict) -> Link:
    per_kind = {kind: (v["latency_s"], v["bandwidth_bytes_per_s"]) for kind, v in spec.get("per_kind", {}).items()}
    return Link(name=spec["name"], latency_s=spec["latency_s"], bandwidth_bytes_per_s=spec["bandwidth_bytes_per_s"],
                per_kind=per_kind)


def load_profile(path: str | os.PathLike) -> Profile:
    """Read a profile JSON written by :func:`calibrate` (format version 2, or 1 without per-kind overrides).

    Raises:
        ValueError: wrong format version or missing keys; says to re-run calibration.
    """
    with open(path) as f:
        data = json.load(f)
    try:
        if data["format_version"] not in _READABLE_FORMAT_VERSIONS:
            raise KeyError("format_version")
        dev = data["device"]
        device = DeviceSpec(
            name=dev["name"],
            peak_flops_per_s={getattr(torch, k): v for k, v in dev["peak_flops_per_s"].items()},
            hbm_bytes=dev["hbm_bytes"], hbm_bytes_per_s=dev["hbm_bytes_per_s"],
            matmul_efficiency=dev["matmul_efficiency"], memory_efficiency=dev["memory_efficiency"],
            launch_overhead_s=dev["launch_overhead_s"], kind="cpu")  # calibrate measures this machine's CPU
        links = {int(n): _link_from_json(spec) for n, spec in data["links"].items()}
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a version-{'/'.join(map(str, _READABLE_FORMAT_VERSIONS))} profile ({exc}); "
                         "re-run `python -m cost_model.calibrate -o PATH`") from exc
    return Profile(device=device, links=links)


def calibrate(nprocs: Sequence[int] = (2, 4), out_path: str | os.PathLike | None = None, progress: bool = True,
              message_sizes_bytes: Sequence[int] = DEFAULT_MESSAGE_SIZES_BYTES,
              matmul_sizes: Sequence[int] = DEFAULT_MATMUL_SIZES, memory_numel: int = 1 << 24,
              repeats: int = 15, kinds: Sequence[str] = CALIBRATED_KINDS, per_kind: bool = True) -> Profile:
    """Measure this machine (module docstring) and return a :class:`Profile`; write JSON if ``out_path``.

    Takes ~30 s with the defaults on a 2-core machine (process start-up dominates).

    Args:
        kinds: collectives to measure (subset of :data:`MEASURABLE_KINDS`, >= 1).
        per_kind: also fit per-kind ``Link.per_kind`` overrides (module docstring); ``False`` gives the
            joint fit only (the behaviour of format version 1).

    Raises:
        ValueError: ``nprocs`` entries < 2, or ``kinds`` empty or unmeasurable.
        RuntimeError: a gloo worker failed (see measure_collectives).
    """
    if any(not isinstance(n, int) or n < 2 for n in nprocs):
        raise ValueError(f"nprocs={tuple(nprocs)}: each process count must be an int >= 2")
    kinds = tuple(kinds)
    if not kinds or any(k not in MEASURABLE_KINDS for k in kinds):
        raise ValueError(f"kinds={kinds}: measure >= 1 of {MEASURABLE_KINDS}")
    steps = ["matmul", "memory", "launch"] + [f"gloo x{n}" for n in nprocs]
    bar = tqdm(total=len(steps), desc="calibrate", disable=not progress)
    measurements: dict = {"collectives": {}}

    def step(label: str) -> None:
        bar.set_postfix_str(label)

    with calibration_threads():
        step("matmul")
        flops_per_s = _measure_matmul_flops_per_s(matmul_sizes)
        bar.update()
        step("memory")
        bytes_per_s = _measure_memory_bytes_per_s(memory_numel)
        bar.update()
        step("launch")
        launch_s = _measure_launch_overhead_s()
        bar.update()
    measurements.update(matmul_flops_per_s=flops_per_s, memory_bytes_per_s=bytes_per_s, launch_overhead_s=launch_s)
    device = DeviceSpec(name="cpu", peak_flops_per_s={torch.float32: flops_per_s},
                        hbm_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
                        hbm_bytes_per_s=bytes_per_s, matmul_efficiency=1.0, memory_efficiency=1.0,
                        launch_overhead_s=launch_s, kind="cpu")
    links = {}
    for n in nprocs:
        step(f"gloo x{n}")
        timings = measure_collectives(n, kinds, message_sizes_bytes, repeats)
        measurements["collectives"][str(n)] = {k: {str(b): s for b, s in v.items()} for k, v in timings.items()}
        samples = [(kind, n, nbytes, s) for kind, by_size in timings.items() for nbytes, s in by_size.items()]
        links[n] = fit_link(samples, name=f"gloo_x{n}", per_kind=per_kind)
        bar.update()
    bar.close()
    if per_kind:  # say which overrides are copies of another kind's fit rather than measured
        measurements["per_kind_reused"] = {k: m for k, m in REUSED_KIND_FITS.items() if k not in kinds and m in kinds}
    profile = Profile(device=device, links=links)
    if out_path is not None:
        with open(out_path, "w") as f:
            json.dump(_profile_to_json(profile, measurements), f, indent=2, sort_keys=True)
            f.write("\n")
    return profile


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: ``python -m cost_model.calibrate -o profile.json [--nprocs 2 4]``."""
    parser = argparse.ArgumentParser(description="Calibrate the cost model on this machine.")
    parser.add_argument("-o", "--out", required=True, help="profile JSON to write")
    parser.add_argument("--nprocs", type=int, nargs="+", default=[2, 4],
                        help="gloo process counts (default: 2 4)")
    args = parser.parse_args(argv)
    profile = calibrate(nprocs=tuple(args.nprocs), out_path=args.out)
    reused = {k: m for k, m in REUSED_KIND_FITS.items() if k not in CALIBRATED_KINDS}

    def fit(kind: str, alpha_s: float, beta: float) -> str:
        if kind in reused:  # not measured: say so instead of printing the other kind's numbers as its own
            return f"; {kind} = {reused[kind]}'s fit (reused, not measured)"
        return f"; {kind} alpha={alpha_s * 1e6:.1f} us beta={beta / 1e9:.2f} GB/s"
    print(f"wrote {args.out}: {profile.device.peak_flops_per_s[torch.float32] / 1e9:.1f} GFLOP/s fp32, "
          f"{profile.device.hbm_bytes_per_s / 1e9:.1f} GB/s, "
          + ", ".join(f"x{n}: alpha={l.latency_s * 1e6:.1f} us beta={l.bandwidth_bytes_per_s / 1e9:.2f} GB/s"
                      + "".join(fit(k, a, b) for k, (a, b) in l.per_kind.items())
                      for n, l in profile.links.items()))

if __name__ == "__main__":
    main()
