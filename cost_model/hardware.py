"""Device specifications: peak compute, memory size and bandwidth, achievable efficiencies.

A :class:`DeviceSpec` holds *datasheet peaks* and separately the *achievable efficiency* factors that
turn a peak into a realistic rate, so every number that prices an op is visible and named:

    achievable matmul FLOP/s   = peak_flops_per_s[dtype] * matmul_efficiency
    achievable memory bytes/s  = hbm_bytes_per_s * memory_efficiency

Conventions
-----------
* ``peak_flops_per_s`` is *dense* (no 2:4 sparsity) FLOP/s, one multiply-add = 2 FLOPs.
* ``torch.float32`` means **non-tensor-core IEEE FP32** (CUDA cores), not TF32: PyTorch defaults to
  ``torch.backends.cuda.matmul.allow_tf32 = False`` since 1.12, so fp32 matmuls do not use TF32 unless
  the user opts in (then pass a spec with the TF32 number, e.g. via ``dataclasses.replace``).
* Memory sizes use the datasheet's decimal GB (1 GB = 1e9 bytes), slightly below the 2**30-based
  capacity the HBM actually has, which leaves room for the CUDA context.

Presets (sources named per constant): :data:`A100_40GB`, :data:`A100_80GB`, :data:`H100_SXM`,
:data:`H200_SXM`. The ``"cpu"`` spec is measured, see :func:`cost_model.calibrate.calibrate`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

import torch

__all__ = ["DeviceSpec", "PipelineActionCost", "GPU_PIPELINE_ACTION", "DEVICE_KINDS", "A100_40GB", "A100_80GB", "H100_SXM", "H200_SXM", "DEVICE_PRESETS", "get_device"]

DEVICE_KINDS = ("gpu", "cpu")
TFLOPS = 1e12
GB = 1e9

# Achievable-efficiency defaults for the GPU presets:
# matmul: a device's best-shape BF16 matmul rate (its "maximum achievable matmul FLOPS", MAMF) as a fraction of its
# dense datasheet peak, measured with the same brute-force shape search on each device (S. Bekman, ml-engineering,
# compute/accelerator/README.md "Maximum Achievable Matmul FLOPS comparison table": A100 SXM 267.9 of 312 TFLOP/s
# = 85.9% (CUDA 12.1), H100 SXM 792.1 of 989 = 80.1% (CUDA 12.1)), times ONE fraction of that best-shape rate that
# a training step's GEMMs reach, the same for every preset: `_GPU_MATMUL_EFFICIENCY` = 0.7 of the A100's peak (0.815
# of its MAMF), which prices the pp = 1 rows of Narayanan et al. SC'21 Table 1 within 2-4% (benchmarks/RESULTS.md).
# Another preset gets 0.7 x its MAMF / the A100's: the H100 0.7 x 0.801 / 0.859 = 0.653 of its peak (its tensor
# cores reach a smaller share of their datasheet peak than the A100's), which the earlier single 0.7 for every
# preset did not say (round 18: the Megatron-LM README's H100 rows of 1.7B and 7.1B were priced 19% and 12% faster
# than measured, torchtitan's Llama 3.1 8B FSDP 1.40-1.45x).
# STREAM-like copies reach ~80-90% of HBM peak; we use 0.8.
# A CUDA kernel launch costs ~3-5 us of host+device overhead; we use 5 us per kernel.
_GPU_MATMUL_EFFICIENCY = 0.7  # of the A100's dense peak; other presets scaled by their MAMF (`_gpu`)
_A100_MAMF = 267.9 / 312
_H100_MAMF = 792.1 / 989  # the H200 has the same die, SMs and clocks (H200 datasheet): the H100's figure
_GPU_MEMORY_EFFICIENCY = 0.8
_GPU_LAUNCH_OVERHEAD_S = 5e-6


@dataclass(frozen=True, slots=True)
class PipelineActionCost:
    """Fixed seconds of host work a pipeline runtime spends per action on top of the stage's priced compute
    (Python dispatch of the schedule, stage bookkeeping, tensor metadata checks, posting and waiting on P2P
    ops, gradient accumulation): per compute action kind (F forward, I backward-input, W backward-weight,
    B full backward), per send and per receive of a cross-rank transfer (the ops built, posted and waited),
    and once per step and rank (`step_s`: the schedule's set-up, microbatch split, loss bookkeeping).
    `planner.simulate` charges each action its kind's seconds on its rank's timeline (issue 14).

    Sources: a calibration profile measures them on this machine (`cost_model.pipeline_actions`); a profile
    without them gets `cost_model.pipeline_actions.CPU_PIPELINE_ACTION` (measured, round 16); the GPU presets
    `GPU_PIPELINE_ACTION` (reasoning there). Every field >= 0 seconds, < 1.

    `comm_thread_s` (round 18): CPU seconds the communication library's own threads (gloo's worker and I/O
    threads, not the thread that posts the op) spend per cross-rank P2P op, each send and each receive. The
    per-thread figures above leave it out (`time.thread_time` of the posting thread); round 17 profiled it at
    10-31 ms per step on 2 ranks of a tiny model (29-61% of a rank's CPU). It is a property of the library,
    not of the runner, so BitPipe's own runner pays the same figure (`planner.simulate` reads it from the
    top level, never from `own_runner`). 0 on the GPU presets (NCCL progresses on the device).

    `comm_thread_per_byte_s` (round 19): the same threads' CPU seconds per byte of each cross-rank send and of each
    receive (they copy the bytes through loopback TCP): a P2P op of n bytes costs its sender and its receiver
    `comm_thread_s + n * comm_thread_per_byte_s` each. The library's, like `comm_thread_s`; 0 on the GPU presets.

    `split_backward_per_node_s` (round 19): CPU seconds per autograd node of a stage that torch's split backward
    (`stage_backward_input` + `stage_backward_weight`, the I / W actions of zbv and dualpipev) spends beyond one
    full backward: Python walks of the stage's autograd graph (parameter groups, intermediates, hooks), so it
    grows with the stage's graph, which the fixed I / W costs above (measured on one Linear(8, 8)) cannot see.
    `planner.simulate` charges it to each W action times the stage's node count (`StageTimes.backward_nodes`).

    `split_backward_per_byte_s` (round 26): CPU seconds per byte of a stage's weight gradients that each W action of
    torch's split backward spends beyond a full backward, on top of the per-node walks: `stage_backward_weight` takes
    the weight gradients from `torch.autograd.grad` as fresh tensors and adds them into `.grad` in Python (an
    allocation and a pass over the bytes) where a full backward's AccumulateGrad accumulates in the engine, so it
    grows with the weights, which the Linear(8, 8) chains of `split_backward_per_node_s` cannot see (r26e: a GPT-2
    block of width 512 split 2.2 ms over its full backward, against 0.9 ms at width 64, where the nodes are the
    same). `planner.simulate` charges it to each W action times the stage's gradient bytes
    (`StageTimes.weight_grad_bytes`); 0 on the GPU presets (the accumulation is a kernel on the device).

    `first_touch_per_byte_s` (round 23): CPU seconds per byte of anonymous memory a process writes for the first
    time (the kernel's page fault and zeroing of each 4 KiB page, and its release), which an allocation beyond the
    memory the allocator already holds pays: `planner.simulate` charges it to the actions that raise a rank's live
    level (in-flight activations + the weight gradients its first backwards allocate anew; `planner.first_touch`,
    round 27) beyond `StageTimes.pool_bytes` (the heap the rank keeps). Measured by the
    calibration (`cost_model.pipeline_actions.first_touch_per_byte_s`: thread CPU of writing a fresh mapping less
    rewriting it); 0 on the GPU presets (activations live in the device allocator's cached pool).

    `own_runner` (round 17): the same costs for the schedules the package runs on its own runner rather than
    torch's (`OWN_RUNNER_SCHEDULES`: BitPipe, `parallelizer.runtime.bitpipe`; its F measured 1.1-2.9x torch's,
    B 0.6-1.2x, round 17); None: those schedules are priced with the fields above (`for_schedule`).

    Raises:
        ValueError: a field that is not seconds in [0, 1); `own_runner` not a PipelineActionCost or None, or one
            with an `own_runner` of its own.
    """

    forward_s: float = 0.0
    backward_input_s: float = 0.0
    backward_weight_s: float = 0.0
    backward_s: float = 0.0
    send_s: float = 0.0
    recv_s: float = 0.0
    step_s: float = 0.0
    comm_thread_s: float = 0.0
    comm_thread_per_byte_s: float = 0.0
    split_backward_per_node_s: float = 0.0
    first_touch_per_byte_s: float = 0.0
    split_backward_per_byte_s: float = 0.0
    own_runner: "PipelineActionCost | None" = None

    def __post_init__(self) -> None:
        for name in self.seconds_fields():
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and 0 <= v < 1):
                raise ValueError(f"PipelineActionCost.{name}={v!r}: must be seconds in [0, 1)")
        if self.own_runner is not None and (not isinstance(self.own_runner, PipelineActionCost)
                                            or self.own_runner.own_runner is not None):
            raise ValueError(f"PipelineActionCost.own_runner={self.own_runner!r}: must be None or a "
                             "PipelineActionCost without an own_runner of its own")

    @staticmethod
    def seconds_fields() -> tuple[str, ...]:
        """The names of the seconds fields (all but `own_runner`), in declaration order."""
        return tuple(f.name for f in dataclasses.fields(PipelineActionCost) if f.name != "own_runner")

    def for_schedule(self, name: str) -> "PipelineActionCost":
        """The costs a step of schedule `name` pays: `own_runner`'s for `OWN_RUNNER_SCHEDULES` when measured,
        else these."""
        return self.own_runner if name in OWN_RUNNER_SCHEDULES and self.own_runner is not None else self

    def compute_s(self) -> tuple[float, float, float, float]:
        """(F, I, W, B) seconds, in `planner.simulate`'s kind order."""
        return (self.forward_s, self.backward_input_s, self.backward_weight_s, self.backward_s)

    def scaled(self, factor: float) -> "PipelineActionCost":
        """Every field multiplied by `factor` (host CPU work slowed by processes sharing the cores)."""
        return PipelineActionCost(*(min(0.5, getattr(self, name) * factor) for name in self.seconds_fields()),
                                  own_runner=None if self.own_runner is None else self.own_runner.scaled(factor))


# Schedules run by the package's own runner (`parallelizer.runtime.bitpipe`), not by torch's pipelining runtime:
# priced with `PipelineActionCost.own_runner` where a profile measured it.
OWN_RUNNER_SCHEDULES = frozenset({"bitpipe"})


# GPU presets: the host work per action (~0.1 ms of Python per action on a CPU host, measured round 16 with
# near-zero compute: benchmarks/RESULTS.md) runs ahead of the device's asynchronous kernel queue and hides
# under the previous action's kernels whenever an action's compute is longer than that, which is the regime
# the GPU presets are priced for (stages of ms); so no host seconds are charged per compute action or per
# step. Each P2P op still launches one NCCL kernel on the device's stream (batch_isend_irecv), which costs a
# kernel launch there: `_GPU_LAUNCH_OVERHEAD_S` per send and per receive.
GPU_PIPELINE_ACTION = PipelineActionCost(send_s=_GPU_LAUNCH_OVERHEAD_S, recv_s=_GPU_LAUNCH_OVERHEAD_S)


def _check_positive(field_name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"DeviceSpec.{field_name}={value!r}: must be a finite number > 0")


def _check_fraction(field_name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and 0 < value <= 1):
        raise ValueError(f"DeviceSpec.{field_name}={value!r}: must be in (0, 1] (a fraction of the peak)")


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """One accelerator (or the calibrated CPU).

    Attributes:
        name: preset key, e.g. ``"h100_sxm"`` or ``"cpu"``.
        peak_flops_per_s: dense peak FLOP/s per dtype (``torch.float32`` = non-tensor-core FP32).
        hbm_bytes: device memory capacity in bytes.
        hbm_bytes_per_s: peak memory bandwidth in bytes/s.
        matmul_efficiency: achievable fraction of ``peak_flops_per_s`` for matmul-like ops, in (0, 1].
        memory_efficiency: achievable fraction of ``hbm_bytes_per_s``, in (0, 1].
        launch_overhead_s: fixed seconds added per kernel (launch + scheduling), >= 0.
        op_host_s, op_host_bwd_s: host seconds per ATen node of the program beyond ``launch_overhead_s`` (the
            Python call of the fx program's node, its dispatch and the autograd record in forward; the autograd
            engine's node in backward, for a node with a floating-point input and output), >= 0, ADDED to the
            node's kernel time (:func:`cost_model.compute.op_cost`): on a CPU the host and the kernel run on the
            same thread, one after the other. 0 for the GPU presets (the host runs ahead of the GPU's stream and
            overlaps the kernels; only ``launch_overhead_s`` is priced there). Measured by calibration
            (:mod:`cost_model.host_cost`; round 21: ~10-20 us per node on this machine's CPU, ~1 us launch).
        optimizer_bytes_per_s: bytes/s the optimizer step streams (its traffic per parameter element:
            :func:`cost_model.compute.optimizer_step_time_s`); ``None``: ``achievable_bytes_per_s`` (a fused,
            memory-bound update, as torch's fused/foreach AdamW on GPUs). Calibration measures torch's AdamW.
        optimizer_tensor_s: fixed seconds per parameter tensor of one optimizer step (dispatch of its
            per-tensor ops), >= 0; 0 for the GPU presets (the fused/foreach kernels batch tensors).
        comm_overlap: fraction in [0, 1] of communication that can hide under computation when the runtime
            overlaps them (bucketed gradient sync, :func:`cost_model.communication.overlapped_comm_exposed_s`):
            1 for the GPU presets (NCCL runs on its own stream/SMs, an assumption); measured by calibration on
            a CPU, where gloo's threads compete with compute for the cores.
        collective_sync_s: seconds added to every blocking collective for the wait on the slowest rank (rank
            skew), >= 0: 0 for the GPU presets (one device per rank, an assumption); measured by calibration
            per process count (:func:`cost_model.measure.measure_collectives`, ``sync_s``): ranks that share
            cores finish the compute before a collective at different times, and a back-to-back calibrated
            collective does not see that wait.
        pipeline_action: fixed seconds per pipeline action by kind (:class:`PipelineActionCost`); zero by
            default, :data:`GPU_PIPELINE_ACTION` for the GPU presets, measured by calibration on a CPU.
        kind: ``"gpu"`` (the datasheet presets) or ``"cpu"`` (a calibrated machine). The planner's defaults
            follow it: bf16 mixed precision, fused kernels (flash attention, torch.compile pointwise fusion)
            and a memory reserve for CUDA workspaces on ``"gpu"``; fp32, eager kernels and no reserve on
            ``"cpu"`` (see ``parallelizer.planner.costs``).

    Raises:
        ValueError: in ``__post_init__`` naming the field, its value and the requirement.
    """

    name: str
    peak_flops_per_s: Mapping[torch.dtype, float]
    hbm_bytes: int
    hbm_bytes_per_s: float
    matmul_efficiency: float
    memory_efficiency: float
    launch_overhead_s: float
    kind: str = "gpu"
    optimizer_bytes_per_s: float | None = None
    optimizer_tensor_s: float = 0.0
    comm_overlap: float = 1.0
    collective_sync_s: float = 0.0
    pipeline_action: PipelineActionCost = PipelineActionCost()
    op_host_s: float = 0.0
    op_host_bwd_s: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"DeviceSpec.name={self.name!r}: must be a non-empty string")
        if not self.peak_flops_per_s:
            raise ValueError(
                f"DeviceSpec.peak_flops_per_s={self.peak_flops_per_s!r}: must map at least one "
                "torch.dtype to FLOP/s, e.g. {torch.float32: 19.5e12}"
            )
        for dtype, flops in self.peak_flops_per_s.items():
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"DeviceSpec.peak_flops_per_s key {dtype!r}: must be a torch.dtype")
            _check_positive(f"peak_flops_per_s[{dtype}]", flops)
        # Freeze the mapping so the spec stays immutable and hashable by identity of its contents.
        object.__setattr__(self, "peak_flops_per_s", MappingProxyType(dict(self.peak_flops_per_s)))
        _check_positive("hbm_bytes", self.hbm_bytes)
        _check_positive("hbm_bytes_per_s", self.hbm_bytes_per_s)
        _check_fraction("matmul_efficiency", self.matmul_efficiency)
        _check_fraction("memory_efficiency", self.memory_efficiency)
        if not (isinstance(self.launch_overhead_s, (int, float)) and 0 <= self.launch_overhead_s < 1):
            raise ValueError(
                f"DeviceSpec.launch_overhead_s={self.launch_overhead_s!r}: must be seconds in [0, 1)"
            )
        for field_name in ("op_host_s", "op_host_bwd_s"):
            value = getattr(self, field_name)
            if not (isinstance(value, (int, float)) and 0 <= value < 1):
                raise ValueError(f"DeviceSpec.{field_name}={value!r}: must be seconds in [0, 1)")
        if self.optimizer_bytes_per_s is not None:
            _check_positive("optimizer_bytes_per_s", self.optimizer_bytes_per_s)
        if not (isinstance(self.optimizer_tensor_s, (int, float)) and 0 <= self.optimizer_tensor_s < 1):
            raise ValueError(f"DeviceSpec.optimizer_tensor_s={self.optimizer_tensor_s!r}: must be seconds in [0, 1)")
        if not (isinstance(self.comm_overlap, (int, float)) and 0 <= self.comm_overlap <= 1):
            raise ValueError(f"DeviceSpec.comm_overlap={self.comm_overlap!r}: must be a fraction in [0, 1]")
        if not (isinstance(self.collective_sync_s, (int, float)) and 0 <= self.collective_sync_s < 1):
            raise ValueError(f"DeviceSpec.collective_sync_s={self.collective_sync_s!r}: must be seconds in [0, 1)")
        if not isinstance(self.pipeline_action, PipelineActionCost):
            raise ValueError(f"DeviceSpec.pipeline_action={self.pipeline_action!r}: must be a PipelineActionCost")
        if self.kind not in DEVICE_KINDS:
            raise ValueError(f"DeviceSpec.kind={self.kind!r}: use one of {DEVICE_KINDS}")

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted((str(k), v) for k, v in self.peak_flops_per_s.items())),
                     self.hbm_bytes, self.hbm_bytes_per_s, self.matmul_efficiency,
                     self.memory_efficiency, self.launch_overhead_s, self.kind, self.optimizer_bytes_per_s,
                     self.optimizer_tensor_s, self.comm_overlap, self.collective_sync_s, self.pipeline_action,
                     self.op_host_s, self.op_host_bwd_s))

    def achievable_flops_per_s(self, dtype: torch.dtype) -> float:
        """Return ``peak_flops_per_s[dtype] * matmul_efficiency`` in FLOP/s.

        Raises:
            ValueError: the spec has no peak for ``dtype``; names the dtypes it has.
        """
        try:
            peak = self.peak_flops_per_s[dtype]
        except KeyError:
            known = ", ".join(sorted(str(d) for d in self.peak_flops_per_s))
            raise ValueError(
                f"device {self.name!r} has no peak FLOP/s for dtype {dtype}; it has: {known}. "
                "Remedy: cast the op to one of these dtypes or build a DeviceSpec with that entry."
            ) from None
        return peak * self.matmul_efficiency

    @property
    def achievable_bytes_per_s(self) -> float:
        """``hbm_bytes_per_s * memory_efficiency`` in bytes/s."""
        return self.hbm_bytes_per_s * self.memory_efficiency

    def scaled(self, compute_factor: float, memory_factor: float, optimizer_factor: float | None = None) -> "DeviceSpec":
        """This spec with every FLOP/s divided by ``compute_factor``, every bytes/s divided by ``memory_factor``
        (the optimizer's by ``compute_factor`` instead when it streams at under half ``hbm_bytes_per_s``: then the
        step is bound by the core, not by memory, as torch's single-tensor AdamW on a CPU at ~1.5 of ~6-10 GB/s),
        and the fixed per-op, per-tensor and per-pipeline-action seconds (dispatch work of the host CPU) multiplied by
        ``compute_factor``
        (factors >= 1 when processes share the device: :class:`cost_model.calibrate.Profile`). A measured
        ``optimizer_factor`` (the optimizer step's own slowdown) replaces that rule for the optimizer.

        Raises:
            ValueError: a factor that is not a finite number > 0.
        """
        _check_positive("scaled compute_factor", compute_factor)
        _check_positive("scaled memory_factor", memory_factor)
        opt = self.optimizer_bytes_per_s
        if opt is not None and optimizer_factor is not None:
            _check_positive("scaled optimizer_factor", optimizer_factor)
            opt /= optimizer_factor
        elif opt is not None:  # core-bound when it streams at under half the memory bandwidth (AdamW on a CPU)
            opt /= compute_factor if opt < self.hbm_bytes_per_s / 2 else memory_factor
        return dataclasses.replace(self, peak_flops_per_s={k: v / compute_factor for k, v in self.peak_flops_per_s.items()},
                                   hbm_bytes_per_s=self.hbm_bytes_per_s / memory_factor, optimizer_bytes_per_s=opt,
                                   launch_overhead_s=min(0.5, self.launch_overhead_s * compute_factor),
                                   optimizer_tensor_s=min(0.5, self.optimizer_tensor_s * compute_factor),
                                   op_host_s=min(0.5, self.op_host_s * compute_factor),
                                   op_host_bwd_s=min(0.5, self.op_host_bwd_s * compute_factor),
                                   pipeline_action=self.pipeline_action.scaled(compute_factor))


def _gpu(name: str, bf16_tflops: float, fp32_tflops: float, hbm_gb: float, hbm_gb_per_s: float,
         mamf: float) -> DeviceSpec:
    """A GPU preset from its datasheet figures; `mamf`: its best-shape BF16 matmul rate / dense peak (sources at
    `_GPU_MATMUL_EFFICIENCY`); its `matmul_efficiency` is `_GPU_MATMUL_EFFICIENCY * mamf / _A100_MAMF`."""
    return DeviceSpec(
        name=name,
        peak_flops_per_s={
            torch.bfloat16: bf16_tflops * TFLOPS,
            torch.float16: bf16_tflops * TFLOPS,
            torch.float32: fp32_tflops * TFLOPS,
        },
        hbm_bytes=int(hbm_gb * GB),
        hbm_bytes_per_s=hbm_gb_per_s * GB,
        matmul_efficiency=_GPU_MATMUL_EFFICIENCY * (mamf / _A100_MAMF),
        memory_efficiency=_GPU_MEMORY_EFFICIENCY,
        launch_overhead_s=_GPU_LAUNCH_OVERHEAD_S,
        pipeline_action=GPU_PIPELINE_ACTION,
    )


# NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4, 2021), SXM column:
# BF16/FP16 tensor core 312 TFLOPS dense, FP32 19.5 TFLOPS, 40GB HBM2 1,555 GB/s; 80GB HBM2e 2,039 GB/s.
A100_40GB = _gpu("a100_40gb", bf16_tflops=312, fp32_tflops=19.5, hbm_gb=40, hbm_gb_per_s=1555, mamf=_A100_MAMF)
A100_80GB = _gpu("a100_80gb", bf16_tflops=312, fp32_tflops=19.5, hbm_gb=80, hbm_gb_per_s=2039, mamf=_A100_MAMF)
# NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column): BF16/FP16 1,979 TFLOPS *with sparsity*,
# i.e. 989.5 dense; FP32 67 TFLOPS; 80GB HBM3 at 3.35 TB/s.
H100_SXM = _gpu("h100_sxm", bf16_tflops=989.5, fp32_tflops=67, hbm_gb=80, hbm_gb_per_s=3350, mamf=_H100_MAMF)
# NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column): same compute as H100 SXM (1,979 TFLOPS
# BF16 with sparsity -> 989.5 dense; FP32 67 TFLOPS); 141GB HBM3e at 4.8 TB/s.
H200_SXM = _gpu("h200_sxm", bf16_tflops=989.5, fp32_tflops=67, hbm_gb=141, hbm_gb_per_s=4800, mamf=_H100_MAMF)

DEVICE_PRESETS: Mapping[str, DeviceSpec] = MappingProxyType(
    {spec.name: spec for spec in (A100_40GB, A100_80GB, H100_SXM, H200_SXM)}
)


def get_device(name: str) -> DeviceSpec:
    """Return the preset called ``name`` (case-insensitive, ``-`` and ``_`` equivalent).

    Raises:
        ValueError: unknown name; lists the valid names and how to get a ``"cpu"`` spec.
    """
    key = name.strip().lower().replace("-", "_")
    if key in DEVICE_PRESETS:
        return DEVICE_PRESETS[key]
    raise ValueError(
        f"unknown device {name!r}; valid names: {', '.join(DEVICE_PRESETS)}. "
        "For this machine's CPU run `python -m cost_model.calibrate -o cpu.profile.json` and "
        "use cost_model.load_profile(path).device."
    )
