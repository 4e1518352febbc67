"""The dtype each compared tensor of a rehearsal is judged at: the least precise dtype of the computation that
can REACH it, not of the whole graph (round 18, r18c).

Before, `runtime.tolerance.compute_dtype` (the least precise dtype ANY node produces) judged every output,
gradient and parameter: a float32 model with one `.half()` side branch (a gate, a quantiser, an auxiliary loss)
was judged at float16's bound everywhere, so an error of 0.1% of the scale on its float32 path was a "match"
(ratio 0.50; 160 at float32's bound; r17a).

The rule (`reach_dtypes`), on the traced ATen graph (`TracedGraph`; autocast regions appear there as explicit
casts, `aten.to.dtype` / `_to_copy`, so the nodes inside an autocast region produce its computing dtype and
count as it). A leaf both sides hold identically (an input, a constant, a buffer forward does not write, a frozen
parameter: `tolerance.fixed_leaves`) rounds nothing and counts as no dtype; a value computed from it counts as its
own dtype (round 25, r25f: RecurrentGemma's bfloat16 `normalizer`, widened before use, put every tensor of the
float32 model at bfloat16's bound):

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
    * ops linear in each input separately (mul, mm / bmm / linear / addmm / matmul, embedding, where): the
      inputs other than the one the gradient flows to (x @ w: dW reads x, dx reads w); an operand passed
      twice (mul(x, x), einsum("i,i", x, x)) is read; not div (d/db of a / b = -a / b^2 reads b);
    * any other op (exp, softmax, norms, SDPA, pow, ...): all its tensor inputs and its own output.
  With `rehearsal._loss` (squares of o) the loss's backward reads o: A(o) joins the region.
- a parameter after k optimizer steps: its gradient at each step, and every step after the first reads the
  updated values of the parameters in its region, which carry their own gradients' rounding: the loosest over
  the closure of "q is a parameter in p's gradient region" of the gradients' dtypes (a fixed point in `reach_dtypes`).
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
from .tolerance import compute_dtype, fixed_leaves, loosest

# ops whose backward reads no forward value: linear in every tensor input (OpOverloadPacket names)
_LINEAR = frozenset({
    "add", "sub", "neg", "view", "reshape", "_unsafe_view", "permute", "transpose", "t", "expand", "expand_as",
    "squeeze", "unsqueeze", "slice", "select", "cat", "stack", "split", "split_with_sizes", "chunk", "unbind",
    "clone", "contiguous", "_to_copy", "to", "alias", "sum", "mean", "flatten", "unflatten", "narrow",
    "view_as", "repeat", "tile", "flip", "roll", "movedim", "pad", "constant_pad_nd", "diagonal", "tril", "triu",
    "detach", "lift_fresh_copy", "type_as", "_assert_tensor_metadata", "getitem",
})
# ops linear in each tensor input separately: the backward towards one input reads the others (not div: the
# derivative by the divisor, -a / b^2, reads the divisor itself)
_MULTILINEAR = frozenset({
    "mul", "mm", "bmm", "matmul", "linear", "addmm", "baddbmm", "addmv", "mv", "dot", "einsum",
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
        operands = pytree.tree_leaves((node.args, node.kwargs))  # einsum's operands come as a list
        for source in flows_from & set(inputs):
            read |= {i for i in inputs if i is not source}
            if sum(1 for a in operands if a is source) > 1:  # mul(x, x), einsum("i,i", x, x): d/dx reads x
                read.add(source)
        return read
    return set(inputs) | {node}


def _own(node, traced: TracedGraph, fixed: frozenset[str]) -> torch.dtype | None:
    """The least precise floating dtype `node` computes (None when none, or for a leaf both sides hold
    identically: `tolerance.fixed_leaves`)."""
    info = traced.nodes.get(node.name)
    if info is None or node.name in fixed:
        return None
    return loosest(*(t.dtype for t in info.outputs if t.dtype.is_floating_point))


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
    """`ReachDtypes` of `traced` (the rule of the module docstring), in one forward and one reverse pass over the
    graph (O(nodes + edges), with parameter sets as bit masks), not one walk per parameter:
    forward, per node n: A[n], the loosest dtype among n and its ancestors, and B[n], the parameters among them;
    reverse, from the loss, per node u that reaches it: G[u], the loosest dtype of the roundings that reach u's
    gradient (u's own dtype, G[n] of each consumer n that reaches the loss, A[r] of each value r that n's
    backward reads towards u), and Q[u], the parameters among those read values' ancestors. The gradient of
    parameter p is judged at G[p]; the union over the paths from p of the module docstring's region is exactly
    what this recursion collects."""
    graph = traced.graph_module.graph
    nodes = list(graph.nodes)
    whole = compute_dtype(traced)
    fixed = fixed_leaves(traced)
    fqn_of = {info.node: info.param_fqn for info in traced.nodes.values() if info.op == "placeholder"
              and info.param_fqn}
    bit = {node: 1 << i for i, node in enumerate(fqn_of)}
    reach_dtype, reach_params = {}, {}  # A[n], B[n]
    for n in nodes:
        parents = n.all_input_nodes
        reach_dtype[n] = loosest(_own(n, traced, fixed), *(reach_dtype[p] for p in parents))
        mask = bit.get(n, 0)
        for p in parents:
            mask |= reach_params[p]
        reach_params[n] = mask
    outputs, first = _user_outputs(traced, reach_dtype)
    if first is None:
        return ReachDtypes(outputs, whole, {}, {}, whole, whole)
    scalar = len(traced.nodes[first.name].outputs[0].shape) == 0
    loss = reach_dtype[first] if scalar else loosest(reach_dtype[first], torch.float32)
    # the loss's ancestors; `rehearsal._loss` squares `first`: its backward reads first (A[first], B[first])
    feeds = {first}
    for n in reversed(nodes):
        if n in feeds:
            feeds.update(n.all_input_nodes)
    grad_dtype = {first: loss if not scalar else _own(first, traced, fixed)}
    grad_params = {first: 0 if scalar else reach_params[first]}
    for u in reversed(nodes):
        if u not in feeds or u is first:
            continue
        dtype, mask = _own(u, traced, fixed), 0
        for n in u.users:
            if n not in grad_dtype:  # not on a path to the loss
                continue
            read = _read_by_backward(n, {u})
            dtype = loosest(dtype, grad_dtype[n], *(reach_dtype[r] for r in read))
            mask |= grad_params[n]
            for r in read:
                mask |= reach_params[r]
        grad_dtype[u], grad_params[u] = dtype, mask
    grads = {fqn: grad_dtype.get(node) for node, fqn in fqn_of.items()}
    # after the steps: p's gradient read the stepped values of the parameters in its region (Q[p]), whose
    # gradients read others': the fixed point of after[p] = loosest(G[p], after[q] for q in Q[p]) (dtypes are
    # a chain of <= 4 levels, so a few sweeps)
    regions = {fqn: [fqn_of[q] for q in fqn_of if grad_params.get(node, 0) & bit[q]] for node, fqn in fqn_of.items()}
    after, changed = dict(grads), True
    while changed:
        changed = False
        for fqn, region in regions.items():
            widened = loosest(after[fqn], *(after[q] for q in region))
            if widened != after[fqn]:
                after[fqn], changed = widened, True
    final = loosest(loss, *(after[fqn] for node, fqn in fqn_of.items() if node in feeds))
    return ReachDtypes(outputs, loss, grads, after, whole, final)


def _user_outputs(traced: TracedGraph, reach_dtype: dict) -> tuple[dict, torch.fx.Node | None]:
    """("output <key path>" -> the loosest dtype reaching that output, as `rehearsal._output_pairs` names the
    leaves; the first tensor output's node, None when there is none). The output node's values follow the
    signature's output specs (buffer mutations first); the tracer's normalisation renames nodes, so the user
    outputs are taken by position, not by the signature's names."""
    exported = traced.exported
    specs = exported.graph_signature.output_specs
    values = list(pytree.tree_leaves(traced.graph_module.graph.output_node().args[0]))
    user = [i for i, s in enumerate(specs) if s.kind.name == "USER_OUTPUT"]
    out_nodes = [values[i] if len(values) == len(specs) and isinstance(values[i], torch.fx.Node) else None
                 for i in user]
    outputs = {}
    try:
        tree = pytree.tree_unflatten(list(range(len(user))), exported.call_spec.out_spec)
        for path, i in leaves_by_path(tree):
            if isinstance(i, int) and i < len(out_nodes) and out_nodes[i] is not None:
                outputs[f"output {path}"] = reach_dtype[out_nodes[i]]
    except Exception:  # noqa: BLE001 - an output tree that does not rebuild: outputs judged by `whole`
        outputs = {}
    first = next((n for n in out_nodes if n is not None and n.name in traced.nodes and traced.nodes[n.name].outputs),
                 None)
    return outputs, first


def narrows_inside(traced: TracedGraph) -> bool:
    """Whether a model with float32 (or wider) parameters casts some value to a 16-bit float inside its forward (a
    `.half()` branch, an autocast region): the values those casts reach are judged at the 16-bit bound, so the
    rehearsal also judges such a model by its float64 replay (`runtime.replay64`, casts widened)."""
    whole = compute_dtype(traced)
    return whole is not None and whole.itemsize <= 2 and any(
        info.dtype.is_floating_point and info.dtype.itemsize >= 4 for info in traced.parameters.values())
