"""The dtypes a traced float32 program computes in under the bf16 autocast recipe (round 25, r25b).

A plan made with precision="bf16" for a model traced in float32 RUNS the traced program under
`torch.autocast(device_type, bfloat16)` (`runtime.precision`, the recipe "autocast_bf16"), and the price must be
that run's: autocast casts the inputs of the ops on its lower-precision list (matmul, linear, mm, addmm, bmm, SDPA,
conv...) to bf16 (new storages, which those ops save for backward), the inputs of the ops on its fp32 list to float32
(on CUDA: layer_norm, softmax, log_softmax, pow, rsqrt, exp, sum, cross_entropy...; on CPU a shorter list), the
inputs of its promote list to their widest dtype, and leaves every other op to type promotion (a residual add of an
fp32 embedding and a bf16 branch is fp32; the traced program's own `.to(float32)` casts stay). Before round 25 every
fp32 tensor was priced as bf16 (2 B/element), while the run keeps the residual stream, norm inputs and the loss's
log-softmax in fp32 (RESULTS.md "Round 24 (lead)": a 0.35B GPT priced 14.11 GB held 16.47 GB on an H200).

`autocast_dtypes` finds torch's own policy per op (not a copied op list): each op node runs once on fake tensors of
its traced shapes and strides, in the dtypes its producers have under autocast, on the device type the plan runs on
(`Pricer.autocast_device`: "cuda" on the GPU presets, whose list differs from the CPU's), with autocast enabled and
the casts it issues recorded (`tracer.regions.run_under_autocast`); not counted as autocast's: an explicit
`.to(dtype)` node's own copy, and an fp32 copy recorded for an op that returns bf16 (the math path of SDPA, which a
CPU-only build takes for fake CUDA tensors and which upcasts its bf16 inputs, where a GPU runs flash attention on
them in bf16). The copies an op's own kernel makes (cross_entropy's fp32 log-softmax of bf16 logits) are real and
kept. Results are memoised per op signature, so a
model's repeated blocks are run once. An op with a device argument (a factory, `.to(device)`) is on no autocast list:
it runs on CPU fake tensors without autocast (fake CUDA tensors cannot be moved on a CPU-only torch build).
"""
from __future__ import annotations

import operator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.fx

from ..errors import PrecisionError
from ..rewriter.apply import bias_in_dtype_of
from ..tracer.normalize import SPLIT_BIAS
from ..tracer.regions import run_under_autocast

__all__ = ["AutocastOp", "autocast_dtypes", "cast_arg_positions", "uniform_dtypes"]

_CASTS = (torch.ops.aten.to, torch.ops.aten._to_copy, torch.ops.aten.type_as)


@dataclass(frozen=True, slots=True)
class AutocastOp:
    """One node under the recipe. `inputs`: per tensor input (map_arg order) the dtype the op computes it in (after
    autocast's cast); `casts`: the tensor-input ordinals autocast copies to another dtype (a new storage each: an
    activation cast per consumer, a weight cast cached per forward); `outputs`: the dtype of each element of the
    node's result (one for a tensor; per element of a tuple, None for a non-tensor)."""

    inputs: tuple[torch.dtype, ...]
    casts: frozenset[int]
    outputs: tuple[torch.dtype | None, ...]


@contextmanager
def _enabled(device_type: str, dtype: torch.dtype):
    """Autocast on `device_type` enabled directly (`torch.autocast("cuda")` disables itself without a CUDA device;
    its policy still applies to fake CUDA tensors: checked on torch 2.13.0+cpu)."""
    prev = torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    torch.set_autocast_enabled(device_type, True)
    torch.set_autocast_dtype(device_type, dtype)
    try:
        yield
    finally:
        torch.set_autocast_enabled(device_type, prev[0])
        torch.set_autocast_dtype(device_type, prev[1])


def _has_device_arg(node: torch.fx.Node) -> bool:
    leaves = torch.utils._pytree.tree_leaves((node.args, dict(node.kwargs)))
    return any(isinstance(x, torch.device) for x in leaves) or node.kwargs.get("device") is not None


def _dtypes(result) -> tuple[torch.dtype | None, ...]:
    if isinstance(result, (tuple, list)):
        return tuple(r.dtype if isinstance(r, torch.Tensor) else None for r in result)
    return (result.dtype,) if isinstance(result, torch.Tensor) else ()


def autocast_dtypes(graph_module: torch.fx.GraphModule, device_type: str, dtype: torch.dtype = torch.bfloat16,
                    received: dict[str, torch.dtype] | None = None) -> dict[str, AutocastOp]:
    """{node name: `AutocastOp`} for every placeholder and call_function node of a traced graph run under
    `torch.autocast(device_type, dtype)` (module docstring); placeholders (parameters, inputs) keep their traced
    dtypes, a pipeline stage's received values named in `received` have the dtype given there (their producer's as
    run in the whole graph, `costs.Pricer.node_dtypes`: a bias-free linear's output arrives bf16, and the stage's
    matmul on it makes no cast copy; before round 26 they kept their traced fp32). A split bias
    (`tracer.normalize.SPLIT_BIAS`) is added in the product's dtype, as the emitted program adds it
    (`rewriter.apply.bias_in_dtype_of`).

    Raises:
        PrecisionError: an op that cannot run on fake tensors of its traced shapes under autocast (names the node,
            its shapes and dtypes, the device type, and the remedy).
    """
    out: dict[str, AutocastOp] = {}
    memo: dict[tuple, AutocastOp] = {}
    for node in graph_module.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder":
            got = (received or {}).get(node.name)
            out[node.name] = AutocastOp((), frozenset(), _dtypes(val) if got is None else (got,))
            continue
        if node.op != "call_function":
            continue
        if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node) and node.args[0].name in out:
            src = out[node.args[0].name].outputs
            idx = node.args[1]
            out[node.name] = AutocastOp((), frozenset(), (src[idx],) if isinstance(idx, int) and idx < len(src)
                                        else _dtypes(val))
            continue
        vals: list = []

        def value(a: torch.fx.Node) -> None:
            v, op = a.meta.get("val"), out.get(a.name)
            if isinstance(v, torch.Tensor) and op is not None and op.outputs and op.outputs[0] is not None:
                v = torch.empty_strided(v.shape, v.stride(), dtype=op.outputs[0], device="meta")
            vals.append(v)

        torch.fx.node.map_arg((node.args, node.kwargs), value)
        split = bool(node.meta.get(SPLIT_BIAS))
        key = (node.target, split, repr(torch.fx.node.map_arg((node.args, dict(node.kwargs)), lambda a: None)),
               tuple((v.dtype, tuple(v.shape), tuple(v.stride())) if isinstance(v, torch.Tensor) else repr(v)
                     for v in vals))
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = _run(node, vals, device_type, dtype, split)
        out[node.name] = hit
    return out


class _Failed:
    """The op's error after autocast's casts were issued (an op whose kernel cannot run on fake CUDA tensors on a
    CPU-only torch build: batch_norm's decomposition makes a real CUDA tensor)."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _run(node: torch.fx.Node, vals: list, device_type: str, dtype: torch.dtype, split: bool) -> AutocastOp:
    """One node's `AutocastOp`: the casts autocast issues for its op (recorded before the kernel runs), and its
    output dtypes from the op run on the cast inputs (on CPU fake tensors without autocast when the kernel cannot
    run on fake `device_type` tensors: dtypes do not depend on the device)."""
    target = node.target
    if split:
        def target(product, bias, *rest, **kwargs):
            return node.target(product, bias_in_dtype_of(bias, product), *rest, **kwargs)

    def guarded(*args, **kwargs):
        try:
            return target(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 -- kept, and retried on CPU below
            return _Failed(exc)

    tensors = [i for i, v in enumerate(vals) if isinstance(v, torch.Tensor)]
    try:
        if _has_device_arg(node):  # on no autocast list (module docstring)
            casts, result = {}, run_under_autocast(node, None, vals, target)[1]
        else:
            casts, result = run_under_autocast(node, (device_type, dtype), vals, guarded, _enabled(device_type, dtype))
            if getattr(node.target, "overloadpacket", None) in _CASTS:
                casts = {}  # the op's own copy (an explicit `.to(dtype)`), on no autocast list
            elif _dtypes(result)[:1] == (dtype,):  # autocast's lower-precision list: it casts to `dtype` only; an
                casts = {i: d for i, d in casts.items() if d == dtype}  # fp32 copy is the math path's (SDPA)
            if isinstance(result, _Failed):
                cast_vals = [v.to(casts[i]) if i in casts else v for i, v in enumerate(vals)]
                result = run_under_autocast(node, None, cast_vals, target)[1]
    except Exception as exc:  # noqa: BLE001 -- any op failure on fake tensors, quoted
        shapes = [(tuple(v.shape), str(v.dtype).removeprefix("torch.")) for v in vals if isinstance(v, torch.Tensor)]
        raise PrecisionError(
            f"node {node.format_node()}: could not run {node.target} on fake {device_type} tensors {shapes} under "
            f"torch.autocast({device_type!r}, {dtype}) to price the bf16 recipe's dtypes ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:300]}). Remedy: plan with precision='fp32' (--precision fp32), or trace "
            "the model in bf16 (model.bfloat16())") from exc
    ordinal = {pos: k for k, pos in enumerate(tensors)}
    if split and len(tensors) > 1 and vals[tensors[1]].dtype != vals[tensors[0]].dtype:
        casts[tensors[1]] = vals[tensors[0]].dtype  # the bias in the product's dtype
    inputs = tuple(casts.get(pos, vals[pos].dtype) for pos in tensors)
    return AutocastOp(inputs, frozenset(ordinal[p] for p in casts), _dtypes(result))


def cast_arg_positions(node: torch.fx.Node, ordinals: frozenset[int]) -> frozenset[int]:
    """Positional arg indices of `node` holding the tensor inputs of the given ordinals (map_arg order; a list
    argument such as cat's holds several)."""
    positions, k = set(), 0
    for i, a in enumerate(node.args):
        for _ in _nodes_in(a):
            if k in ordinals:
                positions.add(i)
            k += 1
    return frozenset(positions)


def _nodes_in(arg) -> list:
    found: list = []
    torch.fx.node.map_arg(arg, found.append)
    return found


def uniform_dtypes(graph_module: torch.fx.GraphModule, dtype: torch.dtype = torch.bfloat16) -> dict[str, AutocastOp]:
    """{node name: `AutocastOp`} with every float32 value in `dtype` and no casts: the assumption every bf16 plan was
    priced under before round 25, kept for a DEFAULTED bf16 (a GPU preset without `precision=`, priced only: the
    runtime runs the traced dtypes) whose graph cannot run under autocast (`Pricer.node_dtypes` warns)."""
    def priced(t):
        return dtype if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else getattr(t, "dtype", None)

    out = {}
    for node in graph_module.graph.nodes:
        if node.op not in ("placeholder", "call_function"):
            continue
        val = node.meta.get("val")
        outs = tuple(priced(v) for v in val) if isinstance(val, (tuple, list)) else (priced(val),)
        ins: list = []
        torch.fx.node.map_arg((node.args, node.kwargs), lambda a: ins.append(priced(a.meta.get("val"))))
        out[node.name] = AutocastOp(tuple(d for d in ins if d is not None), frozenset(), outs)
    return out
