"""The dtype each compared tensor of a rehearsal is judged at: the least precise dtype of the computation that
can REACH it, not of the whole graph (round 18, r18c).

Before, `runtime.tolerance.compute_dtype` (the least precise dtype ANY node produces) judged every output,
gradient and parameter: a float32 model with one `.half()` side branch (a gate, a quantiser, an auxiliary loss)
was judged at float16's bound everywhere, so an error of 0.1% of the scale on its float32 path was a "match"
(ratio 0.50; 160 at float32's bound; r17a).

The rule (`reach_dtypes`), on the traced ATen graph (`TracedGraph`; autocast regions appear there as explicit
casts, `aten.to.dtype` / `_to_copy`, so the nodes inside an autocast region produce its computing dtype and
count as it):

- output o: the forward ancestors of o's node, o included: A(o). Its value is a function of these nodes'
  values only, each rounded to its dtype; nothing else can round it.
- the loss L: the model's scalar first output (A(L)), or `rehearsal._loss` of the first tensor output o, a
  float32 mean of squares: A(o) and float32.
- the gradient of parameter p: autograd computes it by the chain rule over the PATH nodes
  P(p) = D(p) ∩ A(L) (forward descendants of p that are ancestors of L, L included): each path node n holds
  the gradient of its output in n's dtype (so a cast to float16 on the path rounds the gradient: its backward
  casts the gradient), and n's backward reads some forward values R(n); each read value carries the rounding
  of its own ancestors. So the region is P(p) ∪ A(R(n) for n in P(p)), with R(n) (`_read_by_backward`):
    * ops linear in every tensor input (add, sub, neg, views, slices, cat, sums, means, casts, clone): none
      (their derivative is a constant, and a cast's backward casts the gradient: its rounding is n's dtype,
      already counted as a path node);
    * ops linear in each input separately (mul, div by a tensor, mm / bmm / linear / addmm / matmul, embedding,
      where): the inputs other than the one the gradient flows to (x @ w: dW reads x, dx reads w); an input
      both on the path and read (mul(x, x)) is read;
    * any other op (exp, softmax, norms, SDPA, pow, ...): all its tensor inputs and its own output.
  With `rehearsal._loss` (squares of o) the loss's backward reads o: A(o) joins the region.
- a parameter after k optimizer steps: its gradient at each step, and every step after the first reads the
  updated values of the parameters in its region, which carry their own gradients' rounding: the loosest over
  the closure of "q is a parameter in p's gradient region" of the gradients' dtypes (`_closure`).
- anything else the rehearsal compares (buffers after steps, inputs written in place, a compared value whose
  name maps to none of the above, e.g. outputs paired by position): the whole graph's loosest dtype
  (`tolerance.compute_dtype`), the former rule, which is never tighter.

Why it is sound (never tighter than the rounding that can reach the tensor, so a true match is never failed):
every rounding that enters a value happens at a node whose output dtype is counted for that value: a forward
value's rounding at its ancestors; a gradient's at the path nodes (the gradient's own dtype at each step of the
chain rule) and at the nodes whose values the chain rule reads (and their ancestors). The op classes above only
drop a read where the derivative does not depend on that value (a linear map's derivative is constant in the
input it is linear in). Ops not classified read everything. What it does NOT tighten: a cast on the very path of
a value (a `.half().float()` round trip of the main activation) does round that value, and both sides may round
one ulp apart when their float32 inputs differ by float32 rounding; such a value stays at the 16-bit bound.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils import _pytree as pytree

from ..tracer.graph import TracedGraph
from ..tracer.leaves import leaves_by_path
from .tolerance import compute_dtype, loosest

# ops whose backward reads no forward value: linear in every tensor input (OpOverloadPacket names)
_LINEAR = frozenset({
    "add", "sub", "neg", "view", "reshape", "_unsafe_view", "permute", "transpose", "t", "expand", "expand_as",
    "squeeze", "unsqueeze", "slice", "select", "cat", "stack", "split", "split_with_sizes", "chunk", "unbind",
    "clone", "contiguous", "_to_copy", "to", "alias", "sum", "mean", "flatten", "unflatten", "narrow",
    "view_as", "repeat", "tile", "flip", "roll", "movedim", "pad", "constant_pad_nd", "diagonal", "tril", "triu",
    "detach", "lift_fresh_copy", "type_as", "_assert_tensor_metadata", "getitem",
})
# ops linear in each tensor input separately: the backward towards one input reads the others
_MULTILINEAR = frozenset({
    "mul", "div", "mm", "bmm", "matmul", "linear", "addmm", "baddbmm", "addmv", "mv", "dot", "einsum",
    "embedding", "where", "masked_fill", "index_select", "gather", "index", "conv1d", "conv2d", "conv3d",
    "convolution", "outer",
})


def _op_name(target) -> str:
    packet = getattr(target, "overloadpacket", None)
    return getattr(packet, "__name__", None) or getattr(target, "__name__", str(target))


def _read_by_backward(node: torch.fx.Node, flows_from: set[torch.fx.Node]) -> set[torch.fx.Node]:
    """The forward values node's backward reads when the gradient flows to its inputs in `flows_from` (module
    docstring's R(n))."""
    inputs = node.all_input_nodes
    name = _op_name(node.target)
    if name in _LINEAR:
        return set()
    if name in _MULTILINEAR:
        read = set()
        for source in flows_from & set(inputs):
            read |= {i for i in inputs if i is not source}
            if sum(1 for a in node.args if a is source) > 1:  # mul(x, x): d/dx reads x
                read.add(source)
        return read
    return set(inputs) | {node}


def _ancestors(nodes, parents: dict) -> set:
    """`nodes` and all their forward ancestors."""
    seen, stack = set(), list(nodes)
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(parents[n])
    return seen


def _dtypes_of(nodes, traced: TracedGraph) -> set[torch.dtype]:
    return {t.dtype for n in nodes if n.name in traced.nodes for t in traced.nodes[n.name].outputs
            if t.dtype.is_floating_point}


def _loosest_or_none(dtypes) -> torch.dtype | None:
    return loosest(*dtypes) if dtypes else None


@dataclass(frozen=True, slots=True)
class ReachDtypes:
    """The dtype each compared tensor is judged at (module docstring), None where nothing floating reaches it.

    Attributes:
        outputs: "output <key path>" (as `rehearsal._output_pairs` names a leaf) -> dtype.
        loss: the loss's.
        grads: parameter FQN -> its gradient's.
        after_steps: parameter FQN -> its value's after optimizer steps.
        whole: `tolerance.compute_dtype` of the graph, for any other compared value.
        final_loss: the loss's after the steps: the loss's and every reaching parameter's after the steps.
    """

    outputs: dict = field(default_factory=dict)
    loss: torch.dtype | None = None
    grads: dict = field(default_factory=dict)
    after_steps: dict = field(default_factory=dict)
    whole: torch.dtype | None = None
    final_loss: torch.dtype | None = None

    def with_recipe(self, recipe: torch.dtype | None) -> "ReachDtypes":
        """Every entry loosened to a mixed-precision recipe's dtype (`runtime.precision`: the whole forward
        runs under autocast, which the traced graph does not show)."""
        if recipe is None:
            return self
        widen = {k: loosest(v, recipe) for k, v in self.outputs.items()}
        return ReachDtypes(widen, loosest(self.loss, recipe), {k: loosest(v, recipe) for k, v in self.grads.items()},
                           {k: loosest(v, recipe) for k, v in self.after_steps.items()}, loosest(self.whole, recipe),
                           loosest(self.final_loss, recipe))

    def output(self, name: str) -> torch.dtype | None:
        return self.outputs.get(name, self.whole) if name != "loss" else self.loss

    def grad(self, name: str) -> torch.dtype | None:
        return self.grads.get(name, self.whole)

    def param(self, name: str) -> torch.dtype | None:
        return self.after_steps.get(name, self.whole)


def reach_dtypes(traced: TracedGraph) -> ReachDtypes:
    """`ReachDtypes` of `traced` (the rule of the module docstring)."""
    graph = traced.graph_module.graph
    parents = {n: list(n.all_input_nodes) for n in graph.nodes}
    children: dict = {n: [] for n in graph.nodes}
    for n, ps in parents.items():
        for p in ps:
            children[p].append(n)
    whole = compute_dtype(traced)
    exported = traced.exported
    # the output node's values follow the signature's output specs (buffer mutations first); the tracer's
    # normalisation renames nodes, so the user outputs are taken by position, not by the signature's names
    specs = exported.graph_signature.output_specs
    values = list(pytree.tree_leaves(graph.output_node().args[0]))
    user = [i for i, s in enumerate(specs) if s.kind.name == "USER_OUTPUT"]
    out_nodes = [values[i] if len(values) == len(specs) and isinstance(values[i], torch.fx.Node) else None
                 for i in user]
    try:
        tree = pytree.tree_unflatten(list(range(len(user))), exported.call_spec.out_spec)
        paths = [(path, i) for path, i in leaves_by_path(tree)]
    except Exception:  # noqa: BLE001 - an output tree that does not rebuild: outputs judged by `whole`
        paths = []
    outputs = {}
    for path, i in paths:
        if isinstance(i, int) and i < len(out_nodes) and out_nodes[i] is not None:
            outputs[f"output {path}"] = _loosest_or_none(_dtypes_of(_ancestors([out_nodes[i]], parents), traced))
    tensors = [n for n in out_nodes if n is not None and n.name in traced.nodes and traced.nodes[n.name].outputs]
    if not tensors:
        return ReachDtypes(outputs, whole, {}, {}, whole, whole)
    first = tensors[0]
    scalar = len(traced.nodes[first.name].outputs[0].shape) == 0
    loss_reach = _ancestors([first], parents)
    loss = _loosest_or_none(_dtypes_of(loss_reach, traced) | ({torch.float32} if not scalar else set()))
    placeholders = {info.param_fqn: info.node for info in traced.nodes.values()
                    if info.op == "placeholder" and info.param_fqn}
    grads, regions = {}, {}
    for fqn, pnode in placeholders.items():
        down = _descendants(pnode, children)
        path = down & loss_reach  # P(p); `first` is in it when p reaches the loss
        read: set = set() if scalar or first not in path else {first}  # `_loss` squares `first`
        for n in path:
            read |= _read_by_backward(n, path | {pnode})
        region = path | _ancestors(read, parents)
        regions[fqn] = {q for q, qn in placeholders.items() if qn in region}
        grads[fqn] = _loosest_or_none(_dtypes_of(region, traced) | ({torch.float32} if path and not scalar
                                                                     else set()))
    after = {fqn: _loosest_or_none({d for q in _closure(fqn, regions) if (d := grads.get(q)) is not None})
             for fqn in placeholders}
    final = _loosest_or_none({d for q, qn in placeholders.items() if qn in loss_reach
                              if (d := after.get(q)) is not None} | ({loss} if loss else set()))
    return ReachDtypes(outputs, loss, grads, after, whole, final)


def _descendants(node, children: dict) -> set:
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(children[n])
    return seen


def _closure(fqn: str, regions: dict) -> set[str]:
    """`fqn` and every parameter reachable through "is in the gradient region of" (`reach_dtypes`)."""
    seen, stack = set(), [fqn]
    while stack:
        q = stack.pop()
        if q not in seen:
            seen.add(q)
            stack.extend(regions.get(q, ()))
    return seen


def narrows_inside(traced: TracedGraph) -> bool:
    """Whether a model with float32 (or wider) parameters casts some value to a 16-bit float inside its forward (a
    `.half()` branch, an autocast region): the values those casts reach are judged at the 16-bit bound, so the
    rehearsal also judges such a model by its float64 replay (`runtime.replay64`, casts widened)."""
    whole = compute_dtype(traced)
    return whole is not None and whole.itemsize <= 2 and any(
        info.dtype.is_floating_point and info.dtype.itemsize >= 4 for info in traced.parameters.values())
