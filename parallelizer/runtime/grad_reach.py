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

`output_reach` finds, once per plan from the traced graph, which parameters each model output reaches: it runs
the graph on fake tensors (no data, no collectives) with the trained parameters requiring grad and walks autograd's
graph from every output (`grad_fn.next_functions` down to the parameters' AccumulateGrad nodes). Which outputs the
loss reads is known only when it runs (round 23, r23a): a `loss_fn` that ignores an output (a model returning
(logits, aux) trained on the logits alone; `pm.step(loss_fn=None)` reading the model's own loss alone), or reads it
only on some microbatches (a Python branch on the target), leaves the parameters that only that output reaches
without gradient on one device, while torch's stages sent zeros for it. So each microbatch's loss records the
outputs its autograd graph reaches (`read_outputs`, `microbatch_loss.MicrobatchLoss.read`), and after the schedule
`OutputReach.unreached_in_step` takes the union over microbatches and ranks (one all-reduce of a flag per output,
only for a model whose outputs reach different parameter sets) and gives the parameters none of those outputs
reach. A stage-boundary value a later stage uses only under `torch.no_grad()` or `.detach()` needs no flag: the
traced graph holds the detach, so no output reaches the parameters behind it. Because the stages' programs are
fixed graphs, a value gets a real gradient in a microbatch exactly when a read output reaches it, and zeros sent for
a value no gradient reached add exactly 0 to every real gradient: the union over microbatches decides `.grad` None
or not, and the values stay as they are. `drop_unreached` sets the `.grad` of those parameters to None after a
pipeline step's backward, the dp syncs, the tied-copy sums and bitpipe's twin exchange (the step has taken off the
gradients of earlier steps first: `pipeline._take_grads`, so only this step's zeros go).
Plans without "pp" need nothing: each rank's autograd reaches exactly the parameters one device's does, and the
gradient syncs (`rewriter.grad_sync`, the synchronous collectives) run only inside that backward.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.fx

from ..tracer.graph import TracedGraph

__all__ = ["OutputReach", "autograd_leaves", "drop_unreached", "output_reach", "read_outputs", "unreached_parameters"]


def unreached_parameters(traced: TracedGraph) -> frozenset[str]:
    """FQNs (canonical and tied aliases) of the parameters (not buffers) that no output of `traced` reaches through
    autograd: one device's `backward` leaves their `.grad` None whatever the loss (`output_reach(traced).unreached()`)."""
    return output_reach(traced).unreached()


@dataclass(frozen=True)
class OutputReach:
    """Which trained parameters each model output reaches through autograd (`output_reach`).

    names: the traced graph's output values (fx names, in output order: `stage_cut.StageCut.model_outputs`);
    reached[i]: the FQNs (canonical and tied aliases) output i reaches; trained: every trained FQN walked.
    A loss that reads outputs R leaves `.grad` None on one device on exactly `unreached(R)`."""

    names: tuple[str, ...] = ()
    reached: tuple[frozenset[str], ...] = ()
    trained: frozenset[str] = frozenset()

    def unreached(self, read=None) -> frozenset[str]:
        """The trained FQNs no output of `read` (positions in `names`; None: all outputs) reaches."""
        hit = set().union(*(self.reached[i] for i in (range(len(self.reached)) if read is None else read)))
        return self.trained - hit

    @property
    def varies(self) -> bool:
        """Whether which outputs a loss reads can change `unreached`: outputs that reach different parameter sets
        (a model returning (logits, aux) whose aux alone reaches a side head). When False, every loss that reads
        a differentiable output leaves the same parameters without gradient, and a step needs no exchange."""
        return len({r for r in self.reached if r}) > 1

    def unreached_in_step(self, read) -> frozenset[str]:
        """`unreached` for a pipeline step whose loss read the outputs `read` (positions; this rank's
        `MicrobatchLoss.read`: empty off the last stage's ranks): when `varies`, the union over every rank and
        microbatch, by one all-reduce (MAX) of a flag per output over the default group (collective: every rank
        calls it). An output read by any microbatch on any rank gives its parameters a gradient, as one device's
        loss of the whole batch (or accumulated over the microbatches) does."""
        if not self.varies:
            return self.unreached()
        flags = torch.zeros(len(self.names), dtype=torch.int32)
        flags[sorted(read)] = 1
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return self.unreached(flags.nonzero().flatten().tolist())


def output_reach(traced: TracedGraph) -> OutputReach:
    """Per output of `traced`, the trained parameters (not buffers) it reaches through autograd (`OutputReach`),
    found by running the graph once on fake tensors with them requiring grad and walking autograd's graph down to
    their AccumulateGrad nodes (`_leaf_masks`). Frozen parameters are walked as if trained (reaching is a property
    of the graph, and one frozen at build may be unfrozen later: a frozen one gets no gradient anyway). Every output
    reaching nothing (with a RuntimeWarning naming the error, as the runtime then keeps its zero gradients) when the
    graph cannot run on fake tensors."""
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode

    gm = traced.graph_module
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    names: list[str] = []
    torch.fx.node.map_arg(gm.graph.output_node().args, lambda a: names.append(a.name))
    trained = {ph: info for info in traced.parameters.values() if not info.is_buffer for ph in info.placeholders}
    if not trained:
        return OutputReach(tuple(names), (frozenset(),) * len(names))
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
            run = torch.fx.Interpreter(gm, garbage_collect_values=False)
            run.run(*args)
            env = {node.name: value for node, value in run.env.items()}
            masks = _leaf_masks([env.get(n) for n in names], [leaves[name] for name in leaves])
    except Exception as err:  # noqa: BLE001 (any op's failure on fake tensors is named in the warning)
        warnings.warn("could not find which parameters the model's outputs reach through autograd "
                      f"({type(err).__name__}: {err}); under a pipeline plan a parameter one device leaves with .grad None may get a zero "
                      "gradient (weight decay and optimizer state then move it)", RuntimeWarning, stacklevel=2)
        return OutputReach(tuple(names), (frozenset(),) * len(names))
    every = frozenset(f for info in trained.values() for f in (info.fqn, *info.aliases))
    fqns = [trained[name] for name in leaves]  # bit b of a mask: placeholder `list(leaves)[b]` (tied: several)
    reached = tuple(frozenset(f for b, info in enumerate(fqns) if mask >> b & 1 for f in (info.fqn, *info.aliases))
                    for mask in masks)
    return OutputReach(tuple(names), reached, every)


def _leaf_masks(outputs, leaves: list[torch.Tensor]) -> list[int]:
    """Per output (a tensor or not), a bit mask of the `leaves` (bit b: leaves[b]) its autograd graph reaches:
    each node's mask is the OR of its `next_functions`' masks (an `AccumulateGrad` node: its variable's bit), each
    node once, children before parents (an iterative post-order walk: graphs of thousands of nodes)."""
    bit = {id(t): 1 << b for b, t in enumerate(leaves)}
    memo: dict = {}
    for out in outputs:
        fn = out.grad_fn if isinstance(out, torch.Tensor) else None
        stack = [(fn, False)] if fn is not None and fn not in memo else []
        while stack:
            fn, done = stack.pop()
            if fn in memo:
                continue
            children = [nf for nf, _ in fn.next_functions if nf is not None]
            if done:
                mask = bit.get(id(getattr(fn, "variable", None)), 0)
                for nf in children:
                    mask |= memo[nf]
                memo[fn] = mask
            else:
                stack.append((fn, True))
                stack.extend((nf, False) for nf in children if nf not in memo)
    return [(memo[out.grad_fn] if out.grad_fn is not None else bit.get(id(out), 0))
            if isinstance(out, torch.Tensor) else 0 for out in outputs]


def read_outputs(loss: torch.Tensor, outputs) -> set[int]:
    """Positions of `outputs` (tensors; a stage's returned values) that `loss`'s autograd graph reaches: those a
    loss_fn read differentiably (not through `.detach()`, integers or an untaken branch). Walks from `loss.grad_fn`
    and stops at each output (a view of one reaches its (grad_fn, output_nr) edge), so it visits the loss's own
    ops only, not the stage's graph. A loss with an autograd graph that reaches no output by this walk (a graph
    this walk does not follow) counts as reading them all: the step then keeps its zeros, never drops a gradient."""
    keys: dict = {}
    for i, t in enumerate(outputs):
        if isinstance(t, torch.Tensor) and t.requires_grad:
            key = (t.grad_fn, t.output_nr) if t.grad_fn is not None else (None, id(t))
            keys.setdefault(key, []).append(i)
    found: set[int] = set()
    if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
        return found
    stack, seen = [(loss.grad_fn, loss.output_nr) if loss.grad_fn is not None else (None, id(loss))], set()
    while stack:  # edges (autograd node, its output index); a leaf as (None, id): the loss may be an output itself
        edge = stack.pop()
        if edge in keys:
            found.update(keys[edge])
            continue
        fn = edge[0]
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        stack.extend((nf, nr) if getattr(nf, "variable", None) is None else (None, id(nf.variable))
                     for nf, nr in fn.next_functions if nf is not None)
    return found if found or not seen else set(range(len(outputs)))


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
