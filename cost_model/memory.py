"""Memory: training state per parameter (ZeRO), activations saved for backward, and a breakdown.

Training state per parameter, bytes (the table :data:`BYTES_PER_PARAM`, keyed by precision and optimizer):

========= ========= ========= ========= ============================================ ==========
precision optimizer param     grad      optimizer state                              total
========= ========= ========= ========= ============================================ ==========
"bf16"    adam(w)   2 (bf16)  4 (fp32)  12: fp32 main param 4 + Adam m 4 + v 4      18 B/param
"bf16"    sgd       2 (bf16)  4 (fp32)  4: fp32 main param                           10 B/param
"fp32"    adam(w)   4         4         8: Adam m 4 + v 4                            16 B/param
"fp32"    sgd       4         4         0 (torch.optim.SGD, momentum=0: no state)    8 B/param
========= ========= ========= ========= ============================================ ==========

Sources: bf16 + Adam is the recipe of Megatron-LM's distributed optimizer (docs/api-guide/dist_optimizer.md,
bytes-per-parameter table: "bf16 parameters, fp32 gradients": 18 non-distributed, 6 + 12/d distributed
over d data-parallel ranks; fp32: 16 and 8 + 8/d; main parameters always fp32); Megatron accumulates and
all-reduces gradients in fp32 whenever bf16 is on (megatron/training/arguments.py: "bfloat16 requires
gradient accumulation and all-reduce to be done in fp32", unless ``--grad-reduce-in-bf16``). The ZeRO paper's 16 B/param mixed-precision count (Rajbhandari et
al., SC'20, Sec. 3.1: 2 + 2 + 12) keeps fp16 gradients instead; fp32 + Adam is its 4 + 4 + 8. "sgd" is
torch.optim.SGD with its default ``momentum=0``, which keeps no state; SGD with momentum keeps one fp32
buffer (4 B/param more) and is not in the table.

ZeRO (Rajbhandari et al. Fig. 1) for Psi parameters over N data-parallel ranks: stage 1 (P_os) divides the
optimizer state by N (Megatron's distributed optimizer: 6 + 12/N B/param in bf16 + Adam), stage 2 (P_os+g)
also the gradients, stage 3 (P_os+g+p, FSDP) also the parameters. A shard holds ``ceil(Psi / N)``
parameters (flat-parameter padding as in FSDP), so the division is exact when N divides Psi.

Saved activations: :func:`saved_activation_bytes` applies per-op rules that mirror what PyTorch autograd
keeps for backward (tools/autograd/derivatives.yaml); the table is ``_SAVE_RULES``. Rules that depend on which
args require grad (mul, mm, bmm, matmul, linear, addmm, baddbmm keep an operand only when its partner requires grad,
`_Partners`, round 27: a first layer keeps no weight, a frozen weight's layer no input) read it from the graph
(:func:`grad_arg_indices` over :func:`backward_nodes`: rotary cos / sin computed from buffers carry none); without a
graph it is guessed from the values (an upper bound). Checked op by op against autograd's saved tensors by
``benchmarks/saved_by_node.py`` (RESULTS.md, Round 23 (r23e)). Parameters are not
activations: the caller says which positional args are parameters (``param_args``), and
:func:`graph_saved_activation_bytes` finds them from the placeholder names.

One storage, one owner (:func:`saved_tensor_owners`): autograd keeps a tensor saved by several ops once (an
eager softmax output is saved by softmax and again as the input of the next matmul), and a view keeps its
whole base storage alive (q, k, v split from one fused projection). So each saved storage -- a saved
tensor followed back through views (``is_free_op``) and ``getitem`` of multi-output views (split, chunk,
unbind) to the node that allocated it -- is charged to ONE op: the FIRST saver in graph (topological)
order among the ops whose backward runs. That op is charged the whole storage (the saved view's bytes times
storage numel / view numel), every later saver 0 for it. Storages of parameters and buffers (``resident``)
are charged to nobody. The rule is per op, so a sum over nodes (the planner's ILP memory row, a pipeline
segment's activation bytes) counts each storage once.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any, Collection

import torch
import torch.fx

from cost_model._fx import node_values, op_nodes, tensor_nbytes, tensors_in
from cost_model.compute import is_free_op

__all__ = ["MemoryBreakdown", "training_state_bytes", "BYTES_PER_PARAM", "PRECISIONS", "OPTIMIZERS",
           "bytes_per_param", "saved_activation_bytes", "may_save_arg", "save_partners", "SavedShare",
           "saved_tensor_owners", "backward_nodes", "grad_arg_indices", "saved_slots",
           "graph_saved_activation_bytes", "activation_memory_bytes", "inflight_microbatches"]

PRECISIONS = ("bf16", "fp32")  # bf16: bf16 params/activations, fp32 main weights and gradients (docstring)
OPTIMIZERS = ("adamw", "adam", "sgd")
# (precision, optimizer) -> (param, grad, optimizer state) bytes per parameter; sources in the module docstring.
BYTES_PER_PARAM: dict[tuple[str, str], tuple[int, int, int]] = {
    ("bf16", "adamw"): (2, 4, 12), ("bf16", "adam"): (2, 4, 12), ("bf16", "sgd"): (2, 4, 4),
    ("fp32", "adamw"): (4, 4, 8), ("fp32", "adam"): (4, 4, 8), ("fp32", "sgd"): (4, 4, 0),
}
_STAT_BYTES = 4  # mean / rstd / logsumexp are kept in fp32 (the accumulation type) for fp16/bf16 inputs
_MASK_BYTES = 1  # dropout keeps a bool mask, 1 byte per element (Korthikanti et al. 2022, Sec. 4.1)


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Bytes on one device, by category. ``total_bytes`` is their sum."""

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int = 0
    temporary_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """Sum of all categories, bytes."""
        return (self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes
                + self.temporary_bytes)


def bytes_per_param(precision: str, optimizer: str = "adamw") -> tuple[int, int, int]:
    """(param, grad, optimizer state) bytes per parameter of :data:`BYTES_PER_PARAM` (module docstring).

    Raises:
        ValueError: unknown precision or optimizer; names the valid values.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: use one of {PRECISIONS}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r}: use one of {OPTIMIZERS}")
    return BYTES_PER_PARAM[(precision, optimizer)]


def training_state_bytes(num_params: int, precision: str = "bf16", zero_stage: int = 0,
                         dp_size: int = 1, optimizer: str = "adamw") -> MemoryBreakdown:
    """Per-rank bytes of parameters, gradients and optimizer state (module docstring table; ZeRO Fig. 1).

    Example: 7e9 parameters in bf16 with Adam: 18 B/param = 126 GB on one rank; ZeRO stage 1 over 8
    ranks (Megatron's distributed optimizer) 6 + 12/8 = 7.5 B/param; stage 3 over 8 ranks 18/8 B/param.

    Args:
        num_params: parameters held by this rank before ZeRO sharding (Psi), >= 0.
        precision: ``"bf16"`` (bf16 params, fp32 main grads and main params) or ``"fp32"``.
        zero_stage: 0 (DDP), 1, 2 or 3.
        dp_size: ranks the ZeRO shards are spread over (N), >= 1.
        optimizer: ``"adamw"``, ``"adam"`` or ``"sgd"`` (momentum 0).

    Raises:
        ValueError: unknown precision, optimizer or stage, negative counts; names the valid values.
    """
    param_b, grad_b, optim_b = bytes_per_param(precision, optimizer)
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage={zero_stage!r}: use 0, 1, 2 or 3")
    if not (isinstance(num_params, int) and num_params >= 0):
        raise ValueError(f"num_params={num_params!r}: must be an int >= 0")
    if not (isinstance(dp_size, int) and dp_size >= 1):
        raise ValueError(f"dp_size={dp_size!r}: must be an int >= 1")
    shard = math.ceil(num_params / dp_size)
    return MemoryBreakdown(
        params_bytes=param_b * (shard if zero_stage >= 3 else num_params),
        grads_bytes=grad_b * (shard if zero_stage >= 2 else num_params),
        optimizer_bytes=optim_b * (shard if zero_stage >= 1 else num_params),
    )


# --- saved activations -------------------------------------------------------------------------------

aten = torch.ops.aten


@dataclass(frozen=True, slots=True)
class _Saved:
    """What an op saves: positional args, flattened outputs, and extra bytes (stats, masks)."""

    args: tuple[int, ...] = ()
    outputs: tuple[int, ...] = ()
    extra_bytes: int = 0


def _rows(t: torch.Tensor, normalized_ndim: int) -> int:
    return math.prod(t.shape[: t.dim() - normalized_ndim])


def _guess_requires_grad(x: Any) -> bool:
    """Whether `x` requires grad when the graph does not say (`grad_args` None): Meta/Fake tensors rarely carry
    requires_grad, so a floating tensor with more than one element is taken to require grad (0-d constants such
    as attention scales do not). An upper bound: rotary cos / sin, masks and other values computed from buffers
    alone are floating and large but carry no gradient; callers that know the graph pass `grad_args`
    (:func:`grad_arg_indices`)."""
    return isinstance(x, torch.Tensor) and x.is_floating_point() and (x.requires_grad or x.numel() > 1)


@dataclass(frozen=True, slots=True)
class _Partners:
    """The rule of a product: operand i is kept only for the gradient of its partner j, so only when j requires
    grad; `pairs` lists (i, j). torch's autograd codegen (tools/autograd/gen_variable_type.py, `guard_for`) saves a
    tensor used by ONE input's derivative formula under `grad_fn->should_compute_output(that input)`:
    derivatives.yaml mm: `self: mm_mat1_backward(grad, mat2, self.sym_sizes(), ...)`, `mat2: mm_mat2_backward(grad,
    self, ...)`; bmm, addmm (mat1 / mat2), baddbmm (batch1 / batch2) and mul alike. linear and matmul decompose into
    them (a first layer's weight is not kept: its input needs no gradient; a frozen weight's input is not kept).
    Checked against saved-tensor hooks by tests/unit/test_saved_requires_grad.py (round 27, r27e)."""

    pairs: tuple[tuple[int, int], ...]

    def __call__(self, args: tuple, kwargs: dict, out: Any, needs_grad) -> _Saved:
        return _Saved(args=tuple(i for i, j in self.pairs
                                 if i < len(args) and needs_grad(j) and isinstance(args[i], torch.Tensor)))

    def partners(self, index: int) -> tuple[int, ...]:
        """The args whose requiring grad makes the op keep arg `index` (() when it never keeps it)."""
        return tuple(j for i, j in self.pairs if i == index)


_PRODUCT = _Partners(((0, 1), (1, 0)))          # mul, mm, bmm, matmul, linear (its bias, arg 2, is never kept)
_ADDED_PRODUCT = _Partners(((1, 2), (2, 1)))    # addmm, baddbmm: mat1 / mat2 (the added `self` is never kept)


def _einsum_rule(args: tuple, kwargs: dict, out: Any, needs_grad) -> _Saved:
    """einsum(equation, operands) decomposes into permutes, reshapes and bmm (sumproduct_pair), which keeps each
    operand for its partner's gradient: the operand list (arg 1) is kept when one of them requires grad (an upper
    bound: which one is not known by index; `planner.local_storage` runs it on the local values instead)."""
    return _Saved(args=(1,) if needs_grad(1) else ())


def _div_rule(args: tuple, kwargs: dict, out: Any, needs_grad) -> _Saved:
    # div saves `other` for grad_self, and also `self` when `other` requires grad (derivatives.yaml, div.Tensor).
    if not isinstance(args[1], torch.Tensor):
        return _Saved()
    return _Saved(args=(0, 1) if needs_grad(1) else (1,))


def _layer_norm_rule(args: tuple, kwargs: dict, out: Any, needs_grad=None) -> _Saved:
    rows = _rows(args[0], len(args[1]))
    return _Saved(args=(0,), extra_bytes=2 * rows * _STAT_BYTES)  # input + mean + rstd


def _rms_norm_rule(args: tuple, kwargs: dict, out: Any, needs_grad=None) -> _Saved:
    return _Saved(args=(0,), extra_bytes=_rows(args[0], len(args[1])) * _STAT_BYTES)  # input + rstd


def _dropout_rule(args: tuple, kwargs: dict, out: Any, needs_grad=None) -> _Saved:
    p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
    train = args[2] if len(args) > 2 else kwargs.get("train", True)
    return _Saved(extra_bytes=args[0].numel() * _MASK_BYTES if train and p > 0 else 0)


def _sdpa_composite_rule(args: tuple, kwargs: dict, out: Any, needs_grad=None) -> _Saved:
    """q, k, v, the output and the fp32 logsumexp (B, heads, s_q); with an ``attn_mask``, the mask as the
    kernel's backward reads it: a float mask of q's dtype is that tensor (a slot, shared with its other savers),
    a bool mask (or another dtype) is converted to q's dtype at its (broadcast) shape, a new tensor each call
    (measured: torch 2.13 CPU ``_scaled_dot_product_flash_attention_for_cpu`` keeps a (B, 1, s, s) float mask per
    layer for the bool causal mask transformers passes; CUDA's efficient attention keeps its attn_bias alike)."""
    q = args[0]
    logsumexp = math.prod(q.shape[:-1]) * _STAT_BYTES  # (B, heads, s_q) in fp32
    mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
    if not isinstance(mask, torch.Tensor):
        return _Saved(args=(0, 1, 2), outputs=(0,), extra_bytes=logsumexp)
    if mask.dtype == q.dtype and len(args) > 3:
        return _Saved(args=(0, 1, 2, 3), outputs=(0,), extra_bytes=logsumexp)
    return _Saved(args=(0, 1, 2), outputs=(0,), extra_bytes=logsumexp + mask.numel() * q.element_size())


def _indices_rule(args: tuple, kwargs: dict, out: Any, needs_grad=None) -> _Saved:
    """topk / sort / kthvalue / mode / median.dim / max.dim / min.dim return (values, indices) and keep the int64
    indices alone (derivatives.yaml: value_selecting_reduction_backward(grad, dim, indices, sizes)); a full
    max / min / median (one output) keeps its input and its result (evenly_distribute_backward)."""
    if isinstance(out, (tuple, list)) and len(out) == 2:
        return _Saved(outputs=(1,))
    if len(args) > 1 and isinstance(args[1], torch.Tensor):
        return _Saved(args=(0, 1))  # max.other / min.other (elementwise): keeps both operands
    return _Saved(args=(0,), outputs=(0,))


def _cross_entropy_rule(args: tuple, kwargs: dict, out: Any, needs_grad=None) -> _Saved:
    """cross_entropy_loss = log_softmax (keeps its logits-sized output, a storage of its own) + nll_loss (keeps the
    target and its 0-d total_weight): priced as the target and, in the LOSS's dtype, the log-softmax and one element.
    The loss's dtype, not the logits': under CUDA autocast log_softmax is on the fp32 list with its dtype argument
    (bf16 logits in, fp32 log-softmax kept: 1.65 GB beside 0.82 GB of logits for a 0.35B GPT on an H200, RESULTS.md
    "Round 24 (lead)"); before round 25 it was priced in the logits' dtype."""
    logits, loss = args[0], tensors_in(out)
    itemsize = loss[0].element_size() if loss else logits.element_size()
    return _Saved(args=(1,), extra_bytes=(logits.numel() + 1) * itemsize)


_INPUT_SAVERS = (aten.gelu, aten.silu, aten.log, aten.sin, aten.cos, aten.pow, aten.erf, aten.abs, aten.mish,
                 aten.leaky_relu, aten.hardswish, aten.elu)
_OUTPUT_SAVERS = (aten.relu, aten.sigmoid, aten.tanh, aten.exp, aten.softmax, aten._softmax, aten.log_softmax,
                  aten._log_softmax, aten.rsqrt, aten.sqrt)
_NOTHING_SAVED = (aten.add, aten.sub, aten.neg, aten.sum, aten.mean, aten.cat, aten.stack, aten.clone, aten.copy,
                  aten.copy_, aten._to_copy, aten.to, aten.contiguous, aten.reshape, aten.flatten, aten.zeros,
                  aten.ones, aten.full, aten.arange, aten.new_ones, aten.new_zeros, aten.zeros_like,
                  aten.ones_like, aten.full_like, aten.fill, aten.add_, aten.constant_pad_nd, aten.repeat)
_SAVE_RULES: dict[Any, Any] = {
    **{op: _PRODUCT for op in (aten.mm, aten.bmm, aten.matmul, aten.linear)},
    aten.addmm: _ADDED_PRODUCT, aten.baddbmm: _ADDED_PRODUCT, aten.einsum: _einsum_rule,
    # convolution's one joint formula (convolution_backward(grad, input, weight, ...) for input, weight and bias)
    # keeps both whatever requires grad (`guard_for` guards only a tensor used by one input's formula)
    **{op: _Saved(args=(0, 1)) for op in (aten.convolution, aten.conv1d, aten.conv2d, aten.conv3d)},
    **{op: _Saved(args=(0,)) for op in _INPUT_SAVERS},
    **{op: _Saved(outputs=(0,)) for op in _OUTPUT_SAVERS},
    **{op: _Saved() for op in _NOTHING_SAVED},
    aten.mul: _PRODUCT, aten.div: _div_rule,
    aten.layer_norm: _layer_norm_rule, aten.native_layer_norm: _Saved(args=(0,), outputs=(1, 2)),
    aten.rms_norm: _rms_norm_rule, aten._fused_rms_norm: _Saved(args=(0,), outputs=(1,)),
    aten.dropout: _dropout_rule, aten.native_dropout: _Saved(outputs=(1,)),
    aten.scaled_dot_product_attention: _sdpa_composite_rule,
    **{op: _Saved(args=(0, 1, 2), outputs=(0, 1)) for op in (
        aten._scaled_dot_product_flash_attention, aten._scaled_dot_product_efficient_attention,
        aten._scaled_dot_product_flash_attention_for_cpu, aten._scaled_dot_product_cudnn_attention)},
    aten.embedding: _Saved(args=(1,)), aten.index: _Saved(args=(1,)), aten.index_select: _Saved(args=(2,)),
    **{op: _indices_rule for op in (aten.topk, aten.sort, aten.kthvalue, aten.mode, aten.median, aten.max,
                                     aten.min, aten.nanmedian)},
    aten.cross_entropy_loss: _cross_entropy_rule,
    aten.gather: _Saved(args=(2,)), aten.where: _Saved(args=(0,)), aten.nll_loss_forward: _Saved(args=(1,),
                                                                                               outputs=(1,)),
}


def _saved(target: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any,
           grad_args: Collection[int] | None = None) -> _Saved:
    """The save rule of one op; unknown ops with a backward conservatively save all tensor args.

    grad_args: positional indices of the args that require grad (from the graph, :func:`grad_arg_indices`);
    None: guessed from the values (:func:`_guess_requires_grad`, an upper bound)."""
    if is_free_op(target, args, out, kwargs):
        return _Saved()
    if not any(t.is_floating_point() for t in tensors_in(out)):
        return _Saved()  # integer / bool outputs have no backward
    rule = _SAVE_RULES.get(target.overloadpacket)
    if rule is None:
        return _Saved(args=tuple(i for i, a in enumerate(args) if tensors_in(a)))
    if not callable(rule):
        return rule
    if grad_args is None:
        return rule(args, kwargs, out,
                    lambda i: i < len(args) and any(map(_guess_requires_grad, tensors_in(args[i]))))
    return rule(args, kwargs, out, lambda i: i in grad_args)


def saved_slots(target: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any,
                grad_args: Collection[int] | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(positional arg indices, flattened output indices) of the tensors `target` keeps for backward, by its rule in
    ``_SAVE_RULES`` on these values (an op without a rule: every tensor arg; a view or an integer output: none):
    the slots :func:`saved_activation_bytes` counts and a :class:`SavedShare` scales. `grad_args` as there."""
    rule = _saved(target, args, kwargs, out, grad_args)
    return rule.args, rule.outputs


def save_partners(target: torch._ops.OpOverload, index: int) -> tuple[int, ...] | None:
    """The positional args whose requiring grad makes `target` keep its arg `index` for backward, for a product
    (`_Partners`: mm keeps its first operand only for its second's gradient; () when it never keeps it, a linear's
    bias); None for any other op (kept or not whatever requires grad, or by a rule on the values)."""
    rule = _SAVE_RULES.get(getattr(target, "overloadpacket", target))
    return rule.partners(index) if isinstance(rule, _Partners) else None


def may_save_arg(target: torch._ops.OpOverload, index: int, needs_grad=None) -> bool:
    """Whether `target` may keep its positional argument `index` for backward: False when its rule in
    ``_SAVE_RULES`` is a fixed one that does not list it (add, views, ...: nothing), or a product's
    (`save_partners`) whose partners do not require grad (`needs_grad(j)`: whether arg j does; None: unknown, they
    may); rules that depend on the values (div, layer_norm, ...) and ops without a rule answer True
    (layer_norm's autograd keeps its weight AND its bias: native_layer_norm_backward takes both)."""
    partners = save_partners(target, index)
    if partners is not None:
        return bool(partners) and (needs_grad is None or any(needs_grad(j) for j in partners))
    rule = _SAVE_RULES.get(getattr(target, "overloadpacket", target))
    return not isinstance(rule, _Saved) or index in rule.args


@dataclass(frozen=True, slots=True)
class SavedShare:
    """The part of each saved slot an op is charged (module docstring, "one storage, one owner").

    Attributes:
        args: (positional arg index, factor) pairs; outputs: (flattened output index, factor) pairs. A slot
            not listed has factor 1. Factor 0: the slot's storage is charged to an earlier saver (or is a
            parameter/buffer). Factor f > 0: this op is the storage's first saver, and the storage holds f
            times the slot's elements (3.0 for q of a fused qkv projection split in three; < 1 for an
            expanded view). The factor is a ratio of global element counts, so it applies unchanged to the
            slot's local (sharded) shape when the view and its base are sharded alike.
    """

    args: tuple[tuple[int, float], ...] = ()
    outputs: tuple[tuple[int, float], ...] = ()


def saved_activation_bytes(target: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any,
                           param_args: Collection[int] = (), share: SavedShare | None = None,
                           grad_args: Collection[int] | None = None) -> int:
    """Bytes one op keeps alive for backward, excluding parameters.

    Examples of the rules: mm/linear/addmm keep each matrix input whose partner requires grad; gelu keeps its
    input; layer_norm keeps input + fp32 mean/rstd; softmax keeps its output; dropout keeps a 1-byte mask; sdpa keeps q,
    k, v, output and fp32 logsumexp; embedding keeps the indices; add and views keep nothing; mul keeps
    each operand whose partner requires grad. An op with no rule keeps all its tensor args (an upper
    bound).

    Args:
        target, args, kwargs, out: the op and its meta/Fake values, as for :func:`cost_model.op_cost`.
        param_args: positional indices of ``args`` that are parameters (already resident, not counted).
        share: the op's part of storages saved by several ops (:func:`saved_tensor_owners`); None: every
            saved slot counted in full (the op alone).
        grad_args: positional indices of the args that require grad (:func:`grad_arg_indices`: mul keeps an
            operand only when its partner requires grad); None: guessed from the values (an upper bound).

    Returns:
        Bytes (int): extra state (masks, statistics) + sum over saved slots of slot bytes x factor.
    """
    rule = _saved(target, args, kwargs, out, grad_args)
    outputs = tensors_in(out)
    arg_factor = dict(share.args) if share else {}
    out_factor = dict(share.outputs) if share else {}
    nbytes = float(rule.extra_bytes)
    nbytes += sum(tensor_nbytes(t) * arg_factor.get(i, 1.0)
                  for i in rule.args if i not in param_args for t in tensors_in(args[i]))
    nbytes += sum(tensor_nbytes(outputs[i]) * out_factor.get(i, 1.0) for i in rule.outputs)
    return int(round(nbytes))


def _storage_root(node: torch.fx.Node) -> torch.fx.Node:
    """Follow view ops, and getitem of a multi-output view (split, chunk, unbind), back to the node that
    owns the storage."""
    while node.op == "call_function":
        if node.target is operator.getitem:
            src = node.args[0]
            if not (isinstance(src, torch.fx.Node) and isinstance(src.target, torch._ops.OpOverload)):
                break
            args, kwargs, out = node_values(src)
            if not is_free_op(src.target, args, out, kwargs) or not isinstance(src.args[0], torch.fx.Node):
                break
            node = src.args[0]
            continue
        if not isinstance(node.target, torch._ops.OpOverload):
            break
        args, kwargs, out = node_values(node)
        if not is_free_op(node.target, args, out, kwargs) or not isinstance(node.args[0], torch.fx.Node):
            break
        node = node.args[0]
    return node


def _numel(node: torch.fx.Node) -> int:
    return sum(t.numel() for t in tensors_in(node.meta.get("val")))


def _output_key(node: torch.fx.Node, index: int, num_outputs: int) -> str:
    """The storage key of output `index` of `node`: the node itself, or the getitem that takes it."""
    if num_outputs == 1:
        return node.name
    for user in node.users:
        if user.target is operator.getitem and user.args[1] == index:
            return user.name
    return f"{node.name}[{index}]"


def backward_nodes(graph_module: torch.fx.GraphModule, trainable: Collection[str]) -> set[str]:
    """Names of the nodes whose backward runs: the `trainable` placeholders and every call_function node with a
    floating output that depends on one of them (a detach cuts the dependency)."""
    live = set(trainable)
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or getattr(node.target, "overloadpacket", None) is aten.detach:
            continue
        if any(a.name in live for a in node.all_input_nodes) and \
                any(t.is_floating_point() for t in tensors_in(node.meta.get("val"))):
            live.add(node.name)
    return live


def grad_arg_indices(node: torch.fx.Node, live: Collection[str]) -> frozenset[int]:
    """Positional indices of `node`'s args that require grad: nodes in `live` (:func:`backward_nodes`); a list arg
    (einsum's operands) when one of its nodes is."""
    return frozenset(i for i, a in enumerate(node.args)
                     if any(isinstance(x, torch.fx.Node) and x.name in live
                            for x in (a if isinstance(a, (list, tuple)) else (a,))))


def saved_tensor_owners(graph_module: torch.fx.GraphModule, resident: Collection[str] = (),
                        trainable: Collection[str] | None = None) -> dict[str, SavedShare]:
    """The :class:`SavedShare` of every op that saves a storage also saved elsewhere, or a view of a larger
    or smaller storage (module docstring: each storage charged once, to its first saver in graph order).

    Args:
        graph_module: an ATen fx graph whose nodes carry ``meta["val"]`` (torch.export).
        resident: placeholder names of parameters and buffers (never charged: factor 0).
        trainable: placeholder names of trained parameters; an op is a saver only when its output depends on
            one of them (its backward runs). None: every op with a floating output is a saver.

    Returns:
        {node name: SavedShare}; ops not listed are charged every slot in full (factor 1).

    Raises:
        ValueError: a node lacks ``meta["val"]`` or has symbolic shapes.
    """
    resident = set(resident)
    live = None if trainable is None else backward_nodes(graph_module, trainable)
    owned: set[str] = set()
    shares: dict[str, SavedShare] = {}
    for node in op_nodes(graph_module):
        if live is not None and node.name not in live:
            continue
        args, kwargs, out = node_values(node)
        rule = _saved(node.target, args, kwargs, out, None if live is None else grad_arg_indices(node, live))
        slots: list[tuple[str, int, str, int, int]] = []  # (kind, index, storage key, numel, storage numel)
        for i in rule.args:
            arg = node.args[i] if i < len(node.args) else None
            if isinstance(arg, torch.fx.Node):
                root = _storage_root(arg)
                slots.append(("args", i, root.name, _numel(arg), _numel(root)))
        outputs = tensors_in(out)
        for i in rule.outputs:
            slots.append(("outputs", i, _output_key(node, i, len(outputs)), outputs[i].numel(), outputs[i].numel()))
        parts: dict[str, list[tuple[int, float]]] = {"args": [], "outputs": []}
        for kind, i, key, numel, root_numel in slots:
            if key in resident or key in owned:
                factor = 0.0
            else:
                owned.add(key)
                factor = root_numel / numel if numel else 1.0
            if factor != 1.0:
                parts[kind].append((i, factor))
        if parts["args"] or parts["outputs"]:
            shares[node.name] = SavedShare(tuple(parts["args"]), tuple(parts["outputs"]))
    return shares


def graph_saved_activation_bytes(graph_module: torch.fx.GraphModule, param_names: Collection[str] = ()) -> int:
    """Bytes of activations a forward graph keeps for backward, each storage counted once
    (:func:`saved_tensor_owners`): q, k, v views of one fused projection count once, the whole projection;
    parameters and buffers (placeholders named in ``param_names``, e.g.
    ``ep.graph_signature.inputs_to_parameters``) are skipped; extra per-op state (masks, statistics) is
    added per op.

    Raises:
        ValueError: a node lacks ``meta["val"]`` or has symbolic shapes.
    """
    shares = saved_tensor_owners(graph_module, resident=param_names)
    return sum(saved_activation_bytes(node.target, *node_values(node), share=shares.get(node.name))
               for node in op_nodes(graph_module))


def activation_memory_bytes(saved_per_block_bytes: int, num_blocks: int, block_input_bytes: int = 0,
                            checkpoint: bool = False, inflight_microbatches: int = 1) -> int:
    """Peak activation bytes of ``num_blocks`` repeated blocks on one rank.

    Without checkpointing every block keeps ``saved_per_block_bytes`` for each in-flight microbatch.
    With full activation checkpointing a block keeps only its input (``block_input_bytes``) and one block
    is recomputed at a time during backward (Korthikanti et al. 2022, Sec. 5; Chen et al. 2016)::

        no checkpoint: k * L * saved_per_block
        checkpoint:    k * L * block_input + saved_per_block

    where k = ``inflight_microbatches`` (see :func:`inflight_microbatches`).

    Raises:
        ValueError: negative sizes or counts < 1 (naming the argument).
    """
    for name, value, low in (("saved_per_block_bytes", saved_per_block_bytes, 0), ("num_blocks", num_blocks, 0),
                             ("block_input_bytes", block_input_bytes, 0),
                             ("inflight_microbatches", inflight_microbatches, 1)):
        if not (isinstance(value, int) and value >= low):
            raise ValueError(f"{name}={value!r}: must be an int >= {low}")
    if checkpoint:
        return inflight_microbatches * num_blocks * block_input_bytes + saved_per_block_bytes
    return inflight_microbatches * num_blocks * saved_per_block_bytes


def inflight_microbatches(schedule: str, num_stages: int, num_microbatches: int, stage_index: int = 0) -> int:
    """Microbatches whose activations a pipeline stage holds at its peak.

    GPipe runs all forwards first: ``num_microbatches``. 1F1B (PipeDream-Flush, Narayanan et al. SC'21
    Sec. 2.2) caps stage ``i`` at ``num_stages - i`` warm-up microbatches (at most ``num_microbatches``).

    Raises:
        ValueError: unknown schedule, or counts/index out of range.
    """
    if not (isinstance(num_stages, int) and num_stages >= 1 and isinstance(num_microbatches, int)
            and num_microbatches >= 1):
        raise ValueError(f"num_stages={num_stages!r}, num_microbatches={num_microbatches!r}: must be ints >= 1")
    if not 0 <= stage_index < num_stages:
        raise ValueError(f"stage_index={stage_index!r}: must be in [0, {num_stages})")
    if schedule.lower() == "gpipe":
        return num_microbatches
    if schedule.lower() == "1f1b":
        return min(num_stages - stage_index, num_microbatches)
    raise ValueError(f"schedule={schedule!r}: use 'gpipe' or '1f1b'")
