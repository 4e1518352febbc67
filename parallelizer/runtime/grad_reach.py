"""Which trained parameters no output of the traced model reaches through autograd, and keeping their gradient None.

On one device, `loss.backward()` leaves `.grad` None on a parameter that the loss does not reach differentiably:
one read only through integer results (a top-k indexer's scores, whose `.indices` pick tokens: DeepSeek-V4's
compressor and indexer), a comparison, or a value the model detaches. Optimizers treat None and a zero tensor
differently: AdamW / SGD skip a parameter whose `.grad` is None, but decay one with a zero gradient (AdamW moves it
by lr x weight_decay x p per step) and step its momentum / moments; `clip_grad_norm_` and
`zero_grad(set_to_none=True)` count it.

Under a pipeline plan torch's `PipelineStage` sends a ZERO gradient back for every received value whose gradient
is None on the receiving stage (`stage.py`, `get_bwd_send_ops`: "Sending zero gradient"; so does our bitpipe
runner), so the sending stage back-propagates zeros into the parameters that made the value, and they end the
step with a zero tensor in `.grad` (round 21, r21e: DeepSeek-V4, 4 layers, pp=2 x dp=2, 18 parameters; every
parameter after 3 AdamW steps off by 3 x lr 1e-3 x weight_decay 0.01 x 1.0 = 3.0e-5). Tied copies summed over
stages (`pipeline.sum_over_copies`) and bitpipe's twin exchange make zeros the same way.

`unreached_parameters` finds these parameters once per plan from the traced graph: it runs the graph on fake
tensors (no data, no collectives) with the trained parameters requiring grad and walks autograd's graph from every
output that requires grad (`grad_fn.next_functions` down to the parameters' AccumulateGrad nodes). The walk is
conservative: a parameter reached only through an output the caller's loss ignores counts as reached (its
gradient then stays as before: zeros under a pipeline), never the other way round, so no real gradient is ever
dropped. `drop_unreached` sets the `.grad` of those parameters to None after a pipeline step's backward (the step
has taken off the gradients of earlier steps first: `pipeline._take_grads`, so only this step's zeros go).
Plans without "pp" need nothing: each rank's autograd reaches exactly the parameters one device's does, and the
gradient syncs (`rewriter.grad_sync`, the synchronous collectives) run only inside that backward.
"""
from __future__ import annotations

import warnings

import torch
from torch.utils import _pytree as pytree

from ..tracer.graph import TracedGraph

__all__ = ["autograd_leaves", "drop_unreached", "unreached_parameters"]


def unreached_parameters(traced: TracedGraph) -> frozenset[str]:
    """FQNs (canonical and tied aliases) of the parameters (not buffers) that no output of `traced` reaches through
    autograd: one device's `backward` leaves their `.grad` None whatever the loss. Frozen parameters are walked as if
    trained (reaching is a property of the graph, and one frozen at build may be unfrozen later: a frozen one gets
    no gradient anyway). Empty when every parameter is reached, and (with a RuntimeWarning naming the error, as the
    runtime then keeps its zero gradients) when the graph cannot run on fake tensors."""
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode

    gm = traced.graph_module
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    trained = {ph: info for info in traced.parameters.values() if not info.is_buffer for ph in info.placeholders}
    if not trained:
        return frozenset()
    values = [n.meta.get("val") for n in placeholders]
    mode = detect_fake_mode([v for v in values if isinstance(v, torch.Tensor)]) or \
        FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with mode, torch.enable_grad():
            args, leaves = [], {}
            for node, value in zip(placeholders, values):
                if not isinstance(value, torch.Tensor):
                    args.append(traced.constant_inputs.get(node.name, value))
                    continue
                t = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)
                if node.name in trained:
                    t.requires_grad_(True)
                    leaves[node.name] = t
                args.append(t)
            out = torch.fx.Interpreter(gm).run(*args)
            reached = _reached_leaves(t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
    except Exception as err:  # noqa: BLE001 (any op's failure on fake tensors is named in the warning)
        warnings.warn("could not find which parameters the model's outputs reach through autograd "
                      f"({type(err).__name__}: {err}); under a pipeline plan a parameter one device leaves with .grad None may get a zero "
                      "gradient (weight decay and optimizer state then move it)", RuntimeWarning, stacklevel=2)
        return frozenset()
    hit = {trained[name].fqn for name, t in leaves.items() if id(t) in reached}  # tied: any placeholder reached
    out_names = set()
    for info in trained.values():
        if info.fqn not in hit:
            out_names.update((info.fqn, *info.aliases))
    return frozenset(out_names)


def _reached_leaves(outputs) -> set[int]:
    """ids of the leaf tensors that autograd's graph of `outputs` reaches (`autograd_leaves`, and an output that is
    itself a leaf requiring grad)."""
    outputs = list(outputs)
    reached = {id(t) for t in outputs if t.grad_fn is None and t.requires_grad}
    return reached | {id(t) for t in autograd_leaves(outputs)}


def autograd_leaves(outputs) -> list[torch.Tensor]:
    """The leaf tensors requiring grad (parameters, a stage's received activations) that autograd's graph of
    `outputs` (tensors) reaches: each `AccumulateGrad` node's variable, walking `grad_fn.next_functions`, each
    node once, in the walk's order."""
    leaves, seen = [], set()
    stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        variable = getattr(fn, "variable", None)
        if isinstance(variable, torch.Tensor):
            leaves.append(variable)
        stack.extend(nf for nf, _ in fn.next_functions if nf is not None and nf not in seen)
    return leaves


def drop_unreached(stages, unreached: frozenset[str]) -> None:
    """Set `.grad` to None on the parameters of `stages` (modules) named in `unreached` (`unreached_parameters`):
    what a pipeline step's backward gave them are the zeros torch's stages send for a gradient that does not exist."""
    if not unreached:
        return
    for module in stages:
        for fqn, p in module.named_parameters(remove_duplicate=False):
            if fqn in unreached:
                p.grad = None


def presence_mismatch(named) -> tuple[float, str, float] | None:
    """The first gradient that exists on one side only, as a rehearsal's `(|diff|, name, ratio)` with ratio inf
    (a mismatch whatever the values: an optimizer steps a parameter with a zero gradient and skips one with None),
    or None. `named`: (FQN, the plan's `.grad`, one or more references' `.grad`), each a tensor or None. The value
    comparisons count None as zeros, so without this a zero gradient where one device has None matched."""
    for fqn, mine, *refs in named:
        if any((ref is None) != (mine is None) for ref in refs):
            where = "under the plan" if mine is None else "on one device"
            other = "on one device" if mine is None else "under the plan"
            return 0.0, f"{fqn} (.grad None {where}, a tensor {other})", float("inf")
    return None
