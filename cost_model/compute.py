"""Per-ATen-op compute cost: FLOPs, bytes moved and a roofline time, forward and backward.

Model (roofline, Williams et al., "Roofline", CACM 2009)::

    time_s = max(flops / (peak_flops_per_s[dtype] * matmul_efficiency),
                 bytes / (hbm_bytes_per_s * memory_efficiency)) + kernels * launch_overhead_s

* FLOPs come from ``torch.utils.flop_counter``: its ``flop_registry`` formulas (mm, addmm, bmm, baddbmm,
  convolution, scaled-dot-product attention, ...) are called directly on the shapes. An op without a
  formula that is CompositeImplicitAutograd (``aten.linear``, ``aten.matmul``, ``aten.einsum``,
  ``aten.conv2d``, ...; torch.export's training IR keeps some of them) is run on meta tensors under
  ``FlopCounterMode``, which decomposes it to registered ops (linear -> addmm/mm, matmul -> mm/bmm) and
  counts those; e.g. ``linear`` gives ``2 * (input.numel() / in_features) * in_features * out_features``.
  All other ops count 0 FLOPs and are priced by bytes (elementwise FLOPs never bind on GPUs).
* Bytes = every tensor input read + every tensor output written. Gather-like ops (embedding,
  index_select, index, gather) read only output-sized rows of their source, not the whole table. A
  CompositeImplicitAutograd op that torch.export keeps whole is priced as the ATen ops it decomposes into
  (recorded under a ``TorchDispatchMode`` while it runs on meta tensors of the traced shapes and strides, in
  the same single run that counts its FLOPs): their bytes summed, one kernel launch each. So ``cross_entropy_loss`` is ``_log_softmax`` (reads and
  writes the logits) + ``nll_loss_forward`` (reads them again), not one read of the logits, and ``matmul``
  of an operand whose batch dims cannot be merged into one stride (heads split by a permute) includes the
  ``clone`` that makes it contiguous for ``bmm``; ``linear`` and ``layer_norm`` come out as before. Measured
  on one CPU thread (2026-12-01, GPT-2 batch 4 x 128, vocab 2048): the cross-entropy ran 2.5 ms in the step
  against 0.26 ms priced as one read. SDPA and dropout keep their own rules (below).
* Backward: ops with FLOPs cost ``2x`` forward FLOPs (grad-input and grad-weight matmuls; Narayanan et al.
  SC'21 Sec. 5.1 / Kaplan et al. 2020 convention, so forward+backward = 3x forward) in 2 kernels. Every
  op with a floating-point input and output costs ``2x`` forward bytes in backward (it reads the output
  gradient plus saved tensors and writes input gradients) in 1 kernel (2 for FLOP ops). Ops with no
  floating-point input or output (indices, masks, factories) have no backward.
* Dropout with ``p == 0`` or ``train=False`` (``aten.dropout``, ``feature_dropout``, ``alpha_dropout``) is
  free: it returns its input (torch._decomp's dropout decomposition returns ``input.clone()``, which
  torch.compile elides), computes nothing and saves no mask (``cost_model.memory``).
* Scaled-dot-product attention (``aten.scaled_dot_product_attention`` and its fused backends) is ONE fused
  kernel (FlashAttention, Dao et al. 2022; PyTorch dispatches SDPA to flash / memory-efficient / cuDNN
  kernels on GPUs and to a fused flash kernel on CPUs): its FLOPs are those of its two matmuls (as
  ``torch.utils.flop_counter`` counts them), its memory traffic is q, k, v read and o written, plus an
  explicit ``attn_mask`` when one is given (the memory-efficient kernel reads it; is_causal needs none);
  the s x s score matrix is never written. Backward reads q, k, v, o, dO and writes dq, dk, dv: 2x forward
  bytes, as every op here. Saved activations: q, k, v, o and the fp32 logsumexp (``cost_model.memory``).
* Pointwise fusion (optional, ``fused_args`` / ``output_fused`` of :func:`op_cost`, found by
  ``cost_model.fusion.pointwise_fusion``): an argument read from a fused chain is not read from memory, an
  output kept in the chain is not written and launches no kernel.
* View/alias ops (``OpOverload.is_view``: view, permute, transpose, expand, t, unsqueeze, slice, select,
  split, alias, detach, ...) and metadata ops cost 0. Composite may-alias ops (reshape, flatten,
  contiguous, ``to``) are free when they return a view (contiguous input, same dtype) and are a copy
  otherwise. ``aten._to_copy`` always copies.
* Host seconds per node (round 21; ``DeviceSpec.op_host_s`` / ``op_host_bwd_s``, measured by calibration on a
  CPU, :mod:`cost_model.host_cost`; 0 on the GPU presets): every ATen node of the program, free ones (views,
  metadata) included, costs ``op_host_s`` of host time in forward (the fx program's Python call, the dispatch
  and the autograd record) and, when it has a floating-point input and output, ``op_host_bwd_s`` in backward
  (the autograd engine's node; views have one too). On a CPU the host and the kernel run on the same thread,
  so they ADD (measured, round 21: a 16K-element add chain ran host + kernel, not the larger of the two:
  benchmarks/RESULTS.md); on a GPU the host runs ahead of the stream and overlaps the kernels, which is why
  the presets price only ``launch_overhead_s``. At a GPT of width 64 (the schedules bench's ``--quick``) the
  host is most of a node's time (~20 us of ~25).
* Meta tensors carry no data and no real device. Composite ops are run with every device argument mapped to
  ``meta`` (``_fx.to_meta``); an op that still cannot run on meta tensors (it reads a value, e.g. ``.item()``)
  has its FLOPs left uncounted: it is priced as one kernel by the bytes of its inputs and outputs, and
  ``OpCost.uncounted_flops`` says why, so that the caller can record it (the planner lists it in
  ``Plan.fallbacks``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from cost_model._fx import node_values, op_nodes, tensor_nbytes, tensors_in, to_meta
from cost_model.hardware import DeviceSpec

__all__ = ["optimizer_step_time_s", "op_host_seconds", "OpCost", "MetaExecutionError", "op_flops", "op_bytes", "is_free_op", "is_identity_dropout", "op_cost", "graph_flops", "BACKWARD_FLOPS_FACTOR",
           "BACKWARD_BYTES_FACTOR"]

BACKWARD_FLOPS_FACTOR = 2  # backward FLOPs / forward FLOPs of matmul-like ops (see module docstring)
BACKWARD_BYTES_FACTOR = 2  # backward bytes / forward bytes of ops with a backward

aten = torch.ops.aten
_METADATA_OPS = frozenset({aten._assert_tensor_metadata, aten.sym_size, aten.sym_numel, aten.sym_stride,
                           aten.sym_storage_offset, aten._unsafe_view, aten.lift_fresh, aten.empty,
                           aten.empty_strided, aten.empty_like, aten._assert_async, aten.scalar_tensor})
_RESHAPE_OPS = frozenset({aten.reshape, aten.flatten, aten.unflatten, aten.reshape_as, aten.view_as})  # views if strides allow
_GATHER_LIKE_OPS = frozenset({aten.embedding, aten.index_select, aten.index, aten.gather})
_DROPOUT_OPS = frozenset({aten.dropout, aten.feature_dropout, aten.alpha_dropout, aten.feature_alpha_dropout})
_SDPA_OPS = frozenset({aten.scaled_dot_product_attention, aten._scaled_dot_product_flash_attention,
                       aten._scaled_dot_product_efficient_attention, aten._scaled_dot_product_cudnn_attention,
                       aten._scaled_dot_product_flash_attention_for_cpu})


@dataclass(frozen=True, slots=True)
class OpCost:
    """Cost of one op on one device. FLOPs and bytes are counts; times are seconds."""

    fwd_flops: int
    bwd_flops: int
    fwd_bytes: int
    bwd_bytes: int
    fwd_s: float
    bwd_s: float
    uncounted_flops: str | None = None  # why FLOPs could not be counted (priced by bytes only), else None

    @property
    def total_s(self) -> float:
        """``fwd_s + bwd_s``, seconds."""
        return self.fwd_s + self.bwd_s


class MetaExecutionError(ValueError):
    """A composite op could not be run on meta tensors to count its FLOPs (it reads tensor values).

    Attributes: op (the OpOverload's name), cause (the exception torch raised).
    """

    def __init__(self, op: str, cause: BaseException) -> None:
        self.op, self.cause = op, cause
        super().__init__(f"cannot count the FLOPs of {op} on meta tensors ({type(cause).__name__}: "
                         f"{str(cause).splitlines()[0] if str(cause) else ''}); it is priced as one kernel by the bytes of its "
                         f"inputs and outputs")


def _is_composite(target: torch._ops.OpOverload) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), "CompositeImplicitAutograd")


def is_identity_dropout(target: torch._ops.OpOverload, args: tuple, kwargs: dict | None = None) -> bool:
    """True for a dropout op (``aten.dropout(input, p, train)`` and its feature/alpha variants) with
    ``p == 0`` or ``train=False``: it returns its input."""
    if target.overloadpacket not in _DROPOUT_OPS:
        return False
    kwargs = kwargs or {}
    p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
    train = args[2] if len(args) > 2 else kwargs.get("train", True)
    return p == 0 or not train


def is_free_op(target: torch._ops.OpOverload, args: tuple, out: object, kwargs: dict | None = None) -> bool:
    """True when the op moves no data: a view/alias, a metadata op, a may-alias op returning a view, or a
    dropout that returns its input (``is_identity_dropout``).

    ``args`` / ``kwargs``: the op's arguments (tensors as meta/Fake tensors); ``out``: its output(s).
    """
    if target.overloadpacket in _METADATA_OPS or is_identity_dropout(target, args, kwargs):
        return True
    if not target.is_view:
        return False
    if not _is_composite(target):  # a true view kernel: view, transpose, expand, slice, detach, ...
        return True
    inputs, outputs = tensors_in(args), tensors_in(out)
    if not inputs or not outputs:
        return True
    source, result = inputs[0], outputs[0]
    if source.dtype != result.dtype or source.device != result.device:
        return False
    if source.is_contiguous():
        return True
    return target.overloadpacket in _RESHAPE_OPS and _viewable(source, tuple(result.shape))


def _viewable(source: torch.Tensor, shape: tuple[int, ...]) -> bool:
    """Whether ``source.view(shape)`` succeeds for `source`'s strides: a reshape of a NON-contiguous tensor is a
    view when its strides allow (torch's ``reshape`` calls ``view`` then; at::computeStride), e.g. the
    (B, S, H, D)-laid SDPA output (strides of the flash kernels on CPU and CUDA) reshaped to (B, S, H * D) for the
    output projection. Checked on a meta tensor of the same shape and strides (no data)."""
    probe = torch.empty_strided(tuple(source.shape), tuple(source.stride()), dtype=source.dtype, device="meta")
    try:
        probe.view(shape)
    except RuntimeError:
        return False
    return True


def op_flops(target: torch._ops.OpOverload, args: tuple, kwargs: dict, out: object) -> int:
    """Forward FLOPs of one op (multiply-add = 2), from ``torch.utils.flop_counter`` (module docstring).

    Raises:
        ValueError: an op decomposed under ``FlopCounterMode`` has symbolic shapes.
        MetaExecutionError (a ValueError): the op cannot run on meta tensors (it reads a tensor's value).
    """
    return _flops_and_ops(target, args, kwargs, out, want_ops=False)[0]


class _RecordOps(TorchDispatchMode):
    """Records every ATen op dispatched under it as ``(op, args, kwargs, out)`` (the ops a composite runs)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.append((func, args, kwargs or {}, out))
        return out


def _decomposes(target: torch._ops.OpOverload, fused_args: frozenset[int], output_fused: bool) -> bool:
    """Whether ``target``'s bytes are those of the ATen ops it decomposes into: a CompositeImplicitAutograd op
    outside a fused chain, other than SDPA (priced as one fused kernel) and dropout."""
    return (_is_composite(target) and not fused_args and not output_fused
            and target.overloadpacket not in _SDPA_OPS | _DROPOUT_OPS)


def _flops_and_ops(target: torch._ops.OpOverload, args: tuple, kwargs: dict, out: object,
                   want_ops: bool) -> tuple[int, list[tuple] | None]:
    """``(forward FLOPs, decomposition)`` of one op. A CompositeImplicitAutograd op runs ONCE on meta tensors of
    the same shapes and strides under ``FlopCounterMode`` and an op recorder; the decomposition is the list of
    non-free ATen ops ``(op, args, kwargs, out)`` it ran (None unless ``want_ops`` or needed for FLOPs).

    Raises:
        MetaExecutionError: the composite cannot run on meta tensors (it reads a tensor's value).
    """
    packet = target.overloadpacket
    registered = packet in flop_registry
    if is_free_op(target, args, out, kwargs) or not _is_composite(target) or (registered and not want_ops):
        return (int(flop_registry[packet](*args, **kwargs, out_val=out)) if registered else 0), None
    counter, recorder = FlopCounterMode(display=False), _RecordOps()
    meta_args, meta_kwargs = to_meta((args, kwargs))
    try:
        with counter, recorder:
            target(*meta_args, **meta_kwargs)
    except (NotImplementedError, RuntimeError) as exc:  # meta kernels refuse data access (item(), copies)
        raise MetaExecutionError(str(target), exc) from exc
    flops = int(flop_registry[packet](*args, **kwargs, out_val=out)) if registered else int(counter.get_total_flops())
    return flops, [(f, a, k, o) for f, a, k, o in recorder.ops if not is_free_op(f, a, o, k)]


def _bytes_and_kernels(target: torch._ops.OpOverload, args: tuple, kwargs: dict, out: object,
                       fused_args: frozenset[int], output_fused: bool,
                       decomposition: list[tuple] | None) -> tuple[int, int]:
    """``(forward bytes, kernels)`` of one op (:func:`op_bytes`; kernels: 1, 0 when ``output_fused``, or the
    count of the ops of its ``decomposition`` (:func:`_flops_and_ops`) when :func:`_decomposes`)."""
    if is_free_op(target, args, out, kwargs):
        return 0, 0
    if decomposition and _decomposes(target, fused_args, output_fused):
        nbytes = sum(_io_bytes(f, a, k, o, frozenset(), False) for f, a, k, o in decomposition)
        return nbytes, len(decomposition)
    return _io_bytes(target, args, kwargs, out, fused_args, output_fused), 0 if output_fused else 1


def op_bytes(target: torch._ops.OpOverload, args: tuple, kwargs: dict, out: object,
             fused_args: frozenset[int] = frozenset(), output_fused: bool = False) -> int:
    """Forward bytes moved: tensor inputs read + tensor outputs written (0 for free ops).

    Gather-like ops read output-sized rows of their first argument instead of all of it. SDPA writes only
    its attention output (the logsumexp and RNG state of the fused backends are (B, heads, s) and smaller).
    ``fused_args`` (positional indices) are read from a fused chain, and an ``output_fused`` output is not
    written (``cost_model.fusion``). A CompositeImplicitAutograd op (``cross_entropy_loss``, ``matmul``,
    ``linear``, ``layer_norm``, ...) moves the bytes of the ATen ops it decomposes into, run on meta tensors
    of the same shapes and strides: ``cross_entropy_loss`` writes and re-reads its log-softmax, ``matmul`` of
    a head-permuted operand copies it contiguous before ``bmm`` (module docstring).
    """
    try:
        decomposition = _flops_and_ops(target, args, kwargs, out, _decomposes(target, fused_args, output_fused))[1]
    except MetaExecutionError:  # documented: one kernel of its inputs and outputs (op_cost records why)
        decomposition = None
    return _bytes_and_kernels(target, args, kwargs, out, fused_args, output_fused, decomposition)[0]


def _io_bytes(target: torch._ops.OpOverload, args: tuple, kwargs: dict, out: object,
              fused_args: frozenset[int], output_fused: bool) -> int:
    """Bytes of one kernel: its tensor inputs read (gather-like: output-sized rows of the table) + outputs
    written (module docstring)."""
    from_memory = tuple(a for i, a in enumerate(args) if i not in fused_args)
    inputs = tensors_in((from_memory, kwargs))
    outputs = tensors_in(out)
    if target.overloadpacket in _SDPA_OPS:
        outputs = outputs[:1]
    written = 0 if output_fused else sum(tensor_nbytes(t) for t in outputs)
    if target.overloadpacket in _GATHER_LIKE_OPS and inputs:
        rows = sum(tensor_nbytes(t) for t in outputs)
        read = sum(tensor_nbytes(t) for t in inputs if t is not args[0]) + rows  # args[0]: the table
    else:
        read = sum(tensor_nbytes(t) for t in inputs)
    return read + written


def _has_backward(args: tuple, kwargs: dict, out: object) -> bool:
    return (any(t.is_floating_point() for t in tensors_in((args, kwargs)))
            and any(t.is_floating_point() for t in tensors_in(out)))


def _compute_dtype(args: tuple, kwargs: dict, out: object) -> torch.dtype:
    floats = [t for t in tensors_in((args, kwargs)) + tensors_in(out) if t.is_floating_point()]
    return floats[0].dtype if floats else torch.float32


def _roofline_s(flops: int, nbytes: int, kernels: int, dtype: torch.dtype, device: DeviceSpec) -> float:
    if flops == 0 and nbytes == 0:
        return 0.0
    compute_s = flops / device.achievable_flops_per_s(dtype) if flops else 0.0
    memory_s = nbytes / device.achievable_bytes_per_s
    return max(compute_s, memory_s) + kernels * device.launch_overhead_s


def op_host_seconds(args: tuple, kwargs: dict, out: object, device: DeviceSpec) -> tuple[float, float]:
    """(forward, backward) host seconds of one ATen node beyond its kernels' launches (module docstring):
    ``device.op_host_s`` for every node, ``device.op_host_bwd_s`` for a node with a floating-point input and
    output (it records an autograd node, a view included); (0, 0) on the GPU presets."""
    return device.op_host_s, (device.op_host_bwd_s if _has_backward(args, kwargs, out) else 0.0)


def op_cost(target: torch._ops.OpOverload, args: tuple, kwargs: dict, out: object, device: DeviceSpec,
            fused_args: frozenset[int] = frozenset(), output_fused: bool = False) -> OpCost:
    """Forward and backward cost of one ATen op on ``device`` (model in the module docstring).

    Args:
        target: an ``OpOverload`` such as ``torch.ops.aten.mm.default``.
        args, kwargs: its inputs; tensors are meta or Fake tensors with the LOCAL (per-rank) shapes,
            e.g. ``torch.empty(local_shape, dtype=torch.bfloat16, device="meta")``; scalars as Python values.
        out: its output tensor(s) with local shapes.
        device: the device pricing the op.
        fused_args, output_fused: the op's place in a fused pointwise chain (``cost_model.fusion.FusedIO``;
            default: unfused): fewer bytes, and no kernel launch of its own when ``output_fused``.

    Returns:
        :class:`OpCost` with FLOPs, bytes and seconds for forward and backward; an op that cannot run on meta
        tensors is priced by bytes, with the reason in ``uncounted_flops``.

    Raises:
        ValueError: the op does FLOPs in a dtype ``device`` has no peak for, or shapes are symbolic.
    """
    if not isinstance(target, torch._ops.OpOverload):
        raise ValueError(f"op_cost needs a torch._ops.OpOverload (e.g. torch.ops.aten.mm.default), got {target!r}")
    uncounted, decomposition = None, None
    try:
        fwd_flops, decomposition = _flops_and_ops(target, args, kwargs, out,
                                                  _decomposes(target, fused_args, output_fused))
    except MetaExecutionError as exc:
        fwd_flops, uncounted = 0, str(exc)
    fwd_bytes, kernels = _bytes_and_kernels(target, args, kwargs, out, fused_args, output_fused, decomposition)
    has_bwd = not is_free_op(target, args, out, kwargs) and _has_backward(args, kwargs, out)
    bwd_flops = BACKWARD_FLOPS_FACTOR * fwd_flops if has_bwd else 0
    bwd_bytes = BACKWARD_BYTES_FACTOR * fwd_bytes if has_bwd else 0
    dtype = _compute_dtype(args, kwargs, out)
    bwd_kernels = 0 if output_fused else max(kernels, 2 if fwd_flops else 1)
    host_fwd_s, host_bwd_s = op_host_seconds(args, kwargs, out, device)
    return OpCost(
        fwd_flops=fwd_flops,
        bwd_flops=bwd_flops,
        fwd_bytes=fwd_bytes,
        bwd_bytes=bwd_bytes,
        fwd_s=_roofline_s(fwd_flops, fwd_bytes, kernels, dtype, device) + host_fwd_s,
        bwd_s=_roofline_s(bwd_flops, bwd_bytes, bwd_kernels, dtype, device) + host_bwd_s,
        uncounted_flops=uncounted,
    )


def graph_flops(graph_module: torch.fx.GraphModule) -> tuple[int, int]:
    """``(forward_flops, backward_flops)`` summed over the ATen call_function nodes of a forward graph.

    Nodes must carry ``meta["val"]`` (FakeTensors), as graphs from ``torch.export`` do. Backward FLOPs
    follow :func:`op_cost`'s rule (``2x`` forward for FLOP ops with a floating-point input).

    Nodes of the same op signature (:func:`_flops_signature`: target, every tensor's shape, stride, dtype and
    requires_grad, every other argument's type and repr) are counted once: the counts are integers and depend on
    nothing else, so the sum is the same (round 24: a 1T GPT's 128 blocks, 5300 ops, ran FlopCounterMode 5300
    times per pipeline search).

    Raises:
        ValueError: a node lacks ``meta["val"]`` or has symbolic shapes.
    """
    fwd_total = bwd_total = 0
    seen: dict[tuple, tuple[int, bool]] = {}
    for node in op_nodes(graph_module):
        args, kwargs, out = node_values(node)
        key = _flops_signature(node.target, args, kwargs, out)
        hit = None if key is None else seen.get(key)
        if hit is None:
            flops = op_flops(node.target, args, kwargs, out)
            hit = (flops, bool(flops) and _has_backward(args, kwargs, out))
            if key is not None:
                seen[key] = hit
        fwd_total += hit[0]
        if hit[1]:
            bwd_total += BACKWARD_FLOPS_FACTOR * hit[0]
    return fwd_total, bwd_total


def _flops_signature(target, args: tuple, kwargs: dict, out: object) -> tuple | None:
    """What :func:`op_flops` and :func:`_has_backward` read of one op: its target, per tensor (shape, stride,
    dtype, requires_grad) and per other leaf (type, repr), in argument order; None (not memoised) for symbolic
    shapes."""
    leaves = []
    for x in tree_leaves((args, kwargs, out)):  # (not tree_flatten: a garbage cycle per call, `_fx.tensors_in`)
        if isinstance(x, torch.Tensor):
            shape, stride = tuple(x.shape), tuple(x.stride())
            if not all(type(d) is int for d in shape + stride):
                return None
            leaves.append(("tensor", shape, stride, x.dtype, x.requires_grad))
        else:
            leaves.append((type(x).__name__, repr(x)))
    return (target, tuple(leaves))


def optimizer_step_time_s(numel: int, num_tensors: int, bytes_per_element: tuple[int, int, int],
                          device: DeviceSpec) -> float:
    """Seconds of one optimizer step over ``numel`` local parameter elements in ``num_tensors`` tensors.

    The step is memory-bound (AdamW: a few FLOPs per element, Loshchilov & Hutter 2019, Alg. 2): every element's
    parameter and optimizer state are read and written once and its gradient is read once, so with
    ``bytes_per_element = (param, grad, optimizer state)`` bytes (``cost_model.memory.BYTES_PER_PARAM``)::

        traffic_bytes = numel * (2 * param + grad + 2 * optimizer_state)     # fp32 AdamW: 28 B/element
        time_s = traffic_bytes / device.optimizer_bytes_per_s + num_tensors * device.optimizer_tensor_s

    ``optimizer_bytes_per_s`` defaults to the achievable memory bandwidth (a fused one-pass update, as torch's
    fused AdamW); calibration measures torch's default AdamW on the CPU, whose several passes per element and
    per-tensor dispatch the two measured constants absorb (``cost_model.calibrate``).

    Raises:
        ValueError: negative counts or byte sizes.
    """
    if numel < 0 or num_tensors < 0 or any(b < 0 for b in bytes_per_element):
        raise ValueError(f"optimizer_step_time_s: numel={numel}, num_tensors={num_tensors}, "
                         f"bytes_per_element={bytes_per_element}: must be >= 0")
    param, grad, state = bytes_per_element
    if numel == 0:
        return 0.0
    bandwidth = device.optimizer_bytes_per_s or device.achievable_bytes_per_s
    return numel * (2 * param + grad + 2 * state) / bandwidth + num_tensors * device.optimizer_tensor_s
