"""Benchmark: cost_model predictions vs measurements on this machine.

Calibrates (``cost_model.calibrate``, messages up to 64 MiB), then compares predicted and measured seconds for
(a) 10 compute ops (matmul-like and elementwise, fp32, forward only) priced by ``op_cost`` with the
calibrated "cpu" DeviceSpec, and (b) all_reduce / all_gather over 2 and 4 gloo ranks at 3 sizes priced by
``collective_time_s`` on a 1-node mesh with the calibrated Link, which carries piecewise per-kind fits
(``Link.size_fits``) and per-kind alpha/beta overrides (``Link.per_kind``); the joint fit alone is shown
for reference. The compute device is the profile's single-process one (no contention).
Error = |predicted - measured| / measured.

Run: ``python -m benchmarks.bench_cost_model`` (prints the Markdown table); ``run()`` returns it.
"""

from __future__ import annotations

import dataclasses
import statistics

import torch

from cost_model import Cluster, MeshTopology, calibrate, collective_time_s, op_cost
from cost_model.calibrate import QUICK_MESSAGE_SIZES_BYTES, calibration_threads, measure_collectives, time_callable_s

aten = torch.ops.aten
COLLECTIVE_SIZES_BYTES = (1 << 16, 1 << 20, 1 << 23)
NPROCS = (2, 4)


def _compute_cases() -> list[tuple[str, object, tuple, dict]]:
    """(label, aten op, real CPU args, kwargs) for the compute benchmark."""
    r = torch.randn
    return [
        ("mm 512x512x512", aten.mm.default, (r(512, 512), r(512, 512)), {}),
        ("mm 1024x1024x1024", aten.mm.default, (r(1024, 1024), r(1024, 1024)), {}),
        ("addmm 2048x1024x1024", aten.addmm.default, (r(1024), r(2048, 1024), r(1024, 1024)), {}),
        ("bmm 32x(128x64x128)", aten.bmm.default, (r(32, 128, 64), r(32, 64, 128)), {}),
        ("linear 2048x768->3072", aten.linear.default, (r(2048, 768), r(3072, 768), r(3072)), {}),
        ("add 4M", aten.add.Tensor, (r(1 << 22), r(1 << 22)), {}),
        ("mul 4M", aten.mul.Tensor, (r(1 << 22), r(1 << 22)), {}),
        ("gelu 4M", aten.gelu.default, (r(1 << 22),), {}),
        ("softmax 2048x1024", aten._softmax.default, (r(2048, 1024), -1, False), {}),
        ("layer_norm 4096x1024", aten.layer_norm.default, (r(4096, 1024), [1024], r(1024), r(1024)), {}),
    ]


def _to_meta(x):
    return torch.empty_like(x, device="meta") if isinstance(x, torch.Tensor) else x


def _rel_error(predicted_s: float, measured_s: float) -> float:
    return abs(predicted_s - measured_s) / measured_s


def run(progress: bool = True) -> str:
    """Calibrate, measure, predict; return a Markdown report with per-case and median errors."""
    profile = calibrate(nprocs=NPROCS, progress=progress, message_sizes_bytes=QUICK_MESSAGE_SIZES_BYTES)
    dev = profile.device
    rows, errors = [], {"compute": [], "collective": [], "collective_joint": []}
    for label, op, args, kwargs in _compute_cases():
        out = op(*args, **kwargs)
        with calibration_threads():  # the thread count the profile was measured with
            measured = time_callable_s(lambda: op(*args, **kwargs), repeats=15, warmup=3)
        meta_args = tuple(_to_meta(a) for a in args)
        predicted = op_cost(op, meta_args, kwargs, _to_meta(out), dev).fwd_s
        errors["compute"].append(_rel_error(predicted, measured))
        rows.append(("compute", label, predicted, measured, errors["compute"][-1], None))
    measured_kinds = ("all_reduce", "all_gather")
    for n in NPROCS:
        topo = MeshTopology(profile.cluster(n), (n,), ("dp",))
        # Same calibration without the per-kind overrides (the single joint link), for comparison.
        joint = dataclasses.replace(profile.links[n], per_kind={}, size_fits={})
        joint_topo = MeshTopology(Cluster(dev, 1, n, joint, joint), (n,), ("dp",))
        measured_by_kind = measure_collectives(n, measured_kinds, COLLECTIVE_SIZES_BYTES)["collectives"]
        for kind, by_size in measured_by_kind.items():
            for nbytes, measured in by_size.items():
                predicted = collective_time_s(kind, nbytes, topo, "dp")
                errors["collective"].append(_rel_error(predicted, measured))
                errors["collective_joint"].append(_rel_error(collective_time_s(kind, nbytes, joint_topo, "dp"), measured))
                rows.append(("collective", f"{kind} x{n} {nbytes >> 10} KiB", predicted, measured,
                             errors["collective"][-1], errors["collective_joint"][-1]))
    all_errors = errors["compute"] + errors["collective"]
    link_text = "; ".join(
        f"x{n}: joint alpha {l.latency_s * 1e6:.1f} us, beta {l.bandwidth_bytes_per_s / 1e9:.2f} GB/s"
        + "".join(f", {k} {a * 1e6:.1f} us / {b / 1e9:.2f} GB/s" for k, (a, b) in l.per_kind.items()
                  if k in measured_kinds)
        for n, l in profile.links.items())
    lines = [
        "## cost_model: predicted vs measured (this machine)",
        "",
        f"Calibrated cpu: {dev.peak_flops_per_s[torch.float32] / 1e9:.1f} GFLOP/s fp32, "
        f"{dev.hbm_bytes_per_s / 1e9:.2f} GB/s, launch {dev.launch_overhead_s * 1e6:.1f} us; gloo {link_text}.",
        "",
        "| group | case | predicted ms | measured ms | error | error, joint link only |",
        "|---|---|---:|---:|---:|---:|",
        *[f"| {g} | {label} | {p * 1e3:.3f} | {m * 1e3:.3f} | {e:.0%} | {'' if j is None else f'{j:.0%}'} |"
          for g, label, p, m, e, j in rows],
        "",
        f"Median error: compute {statistics.median(errors['compute']):.0%}, "
        f"collectives {statistics.median(errors['collective']):.0%}, "
        f"all {statistics.median(all_errors):.0%} (target <= 25%). "
        f"Joint link only (no per-kind overrides): collectives "
        f"{statistics.median(errors['collective_joint']):.0%}, "
        f"all {statistics.median(errors['compute'] + errors['collective_joint']):.0%}.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(run())
