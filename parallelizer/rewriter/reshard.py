"""Reshard after forward: gathered parameters are freed when forward is done with them and gathered again
for backward, as FSDP does (torch FSDP2 `fully_shard(reshard_after_forward=True)`).

Without this pass, an op that saves a gathered parameter for backward (linear saves its weight, embedding
its table's use...) keeps the FULL parameter alive from its forward to its backward: a ZeRO-3 plan would
then hold every gathered layer at once, which is what the planner does not price (the planner counts
parameters at their stored, sharded size and prices the backward re-gather: `core.redistribute.edge_steps`
with `is_parameter`). This pass makes the emitted program do what is priced.

What it does to an emitted rank program (an fx graph made by `rewriter.apply`), for every value G that is
the output of an `all_gather` step on a chain of steps starting at a parameter placeholder:

1. after the last forward use of G (or of a view of G), `release(G)` resizes G's storage to 0 bytes: the
   memory is freed while every saved reference keeps pointing at the (now empty) storage;
2. every op that consumes G (or a view of it), returns a fresh tensor and may save G for backward
   (`cost_model.memory.may_save_arg`: linear does, add does not) gets its output wrapped in
   `refill(out, G, param, partners)`: an identity in forward whose backward first gathers G again (the same chain
   of collectives, from the parameter's current shard, without autograd) into G's storage, then passes the
   gradient on. A product keeps G only for its partner's gradient (`cost_model.memory.save_partners`: a first
   layer's input needs none, so its weight is not kept): the refill is skipped at run time when none of
   `partners` requires grad, as autograd then saves nothing of G (round 27, r27e: the first linear of a model
   re-gathered its weight in backward for nothing). The consumer's own backward runs after that identity's (its
   output's gradient flows through it), so the saved weight is whole again when it is read. A second consumer
   finds it refilled;
3. after its LAST backward use the refilled storage is freed again (FSDP2's reshard after backward): once
   refilled, the program keeps no reference of its own to it (`ReshardedParameter.refill` holds it only
   until its re-gather, then weakly), so the storage lives exactly as long as autograd keeps a saved tensor
   on it: each consumer's backward node frees its saved tensors after it runs, and the last one frees G.
   This is autograd's own count of the uses: tied weights, a weight read by several ops, composite ops
   whose saving node is not the output's, a split input / weight backward (`retain_graph`) all keep G
   exactly as long as one of their nodes still needs it. The holder stays strong until the first re-gather,
   so every rank runs that collective whatever else holds G; G emptied again after it (by anything but this
   pass) is an `UnsupportedOpError` at the next refill, not a read of freed memory. Round 26 (r26c): until
   then the refill closure held G whole while the refill's autograd node lived (a 2-rank GPT-2 fsdp step,
   hidden 256: 30% more at its peak, RESULTS.md).

All ranks run the same backward graph in the same order, so the re-gathers (collectives) match across
ranks. G is left alone (kept, as before) when something could see the freed storage: G or a view of it is
a graph output, is written in place, or feeds an op that returns several tensors or a non-aten helper.
"""
from __future__ import annotations

import operator
from collections.abc import Callable

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.weak import WeakIdKeyDictionary

from cost_model.memory import may_save_arg, save_partners

from ..errors import UnsupportedOpError
from ..tracer.graph import is_view, may_alias, mutated_args


class _Refill(torch.autograd.Function):
    """Identity in forward; in backward, `regather()` first (module docstring, step 2)."""

    @staticmethod
    def forward(ctx, out, regather):  # type: ignore[override]
        ctx.regather = regather
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        ctx.regather()
        return grad, None


class ReshardedParameter:
    """The chain of collectives from one parameter's shard to a gathered value G, and the two calls the
    program makes: `release(G)` after forward, `refill(out, G, shard)` around each consumer of G.

    `chain`: (collective function, its arguments after the tensor) per step, in order; `label`: the gathered value,
    its parameter and its backward readers, for errors."""

    def __init__(self, chain: tuple[tuple[Callable, tuple], ...], label: str = "") -> None:
        self.chain, self.label = chain, label
        self.held: WeakIdKeyDictionary = WeakIdKeyDictionary()  # gathered tensor -> its storage, shared by its refills

    def release(self, gathered: torch.Tensor) -> None:
        """Free the storage of `gathered` (its bytes; the tensor and its saved references stay valid)."""
        if torch.is_grad_enabled() and gathered.untyped_storage().nbytes():
            gathered.untyped_storage().resize_(0)

    def refill(self, out: torch.Tensor, gathered: torch.Tensor, shard: torch.Tensor,
               partners: tuple | None = None) -> torch.Tensor:
        """`out` unchanged; its backward re-gathers `gathered` from `shard` first when it was released.
        `partners`: the consumer's args whose requiring grad makes it keep `gathered` (a product's,
        `cost_model.memory.save_partners`); when none does, autograd keeps nothing of it: no re-gather. None: kept.

        The storage of `gathered` is held strongly until the first re-gather (so that every rank runs that
        collective, whatever else holds the storage), weakly after it (module docstring, step 3): it is freed
        when the last saved tensor on it is (after its last consumer's backward). A consumer whose backward
        runs after that cannot need it (it would hold a saved tensor on it)."""
        if not (torch.is_grad_enabled() and out.requires_grad):
            return out
        if partners is not None and not any(isinstance(p, torch.Tensor) and p.requires_grad for p in partners):
            return out
        held = self.held.get(gathered)
        if held is None:  # the first consumer of this forward's gathered value: one holder for all its refills
            held = self.held[gathered] = _Held(gathered.untyped_storage())
        nbytes = gathered.untyped_storage().nbytes()
        geometry = (gathered.storage_offset(), tuple(gathered.shape), gathered.stride())

        def regather() -> None:
            storage = held.get()
            if storage is None or storage.nbytes():
                return  # freed after its last backward use, still there, or refilled by another consumer's backward
            if held.storage is None:  # refilled once, then emptied by something else: its readers would read freed memory
                raise UnsupportedOpError(
                    f"the gathered parameter {self.label} was refilled in backward and then released again before "
                    "its last backward reader ran: that reader would read freed memory. Remedy: do not resize the "
                    "storage of a gathered parameter outside `rewriter.reshard`, or plan with axis_roles 'ddp'")
            with torch.no_grad():
                value = shard
                for fn, args in self.chain:
                    value = fn(value, *args)
                storage.resize_(nbytes)
                offset, shape, stride = geometry
                torch.empty(0, dtype=value.dtype).set_(storage, offset, shape, stride).copy_(value)
            held.weaken()  # from now on only the consumers' saved tensors keep it (module docstring, step 3)

        return _Refill.apply(out, regather)


class _Held:
    """One storage, held strongly until `weaken()`, then by a weak reference (`StorageWeakRef`: torch's C++ weak
    pointer to the storage, as torch.multiprocessing uses it); shared by all the refills of one gathered value."""

    __slots__ = ("storage", "weak")

    def __init__(self, storage: torch.UntypedStorage) -> None:
        self.storage: torch.UntypedStorage | None = storage
        self.weak = StorageWeakRef(storage)

    def get(self) -> torch.UntypedStorage | None:
        """The storage, or None when it was freed (weakened and no tensor on it is left)."""
        if self.storage is not None:
            return self.storage
        return None if self.weak.expired() else torch.UntypedStorage._new_with_weak_ptr(self.weak.cdata)

    def weaken(self) -> None:
        self.storage = None


def reshard_after_forward(graph: torch.fx.Graph, parameters: set[torch.fx.Node]) -> int:
    """Apply the pass (module docstring) to `graph` in place; `parameters` are the placeholders of parameters.
    Returns how many gathered values are released after forward."""
    released = 0
    for gathered in [n for n in graph.nodes if _is_parameter_gather(n, parameters)]:
        aliases, refilled = _refilled(gathered)
        consumers = list(dict.fromkeys(c for c, _ in refilled))
        partners = {c: _partners(c, aliases) for c in consumers}
        if not consumers:
            continue  # kept (something could see the freed storage), or saved by nobody (freed after its last
            # forward use anyway): not gathered again in backward
        chain, shard = _chain(gathered)
        resharded = ReshardedParameter(chain, f"{gathered.name} (parameter {shard.name}, read in backward by "
                                              f"{', '.join(c.name for c in consumers)})")
        for consumer in consumers:
            with graph.inserting_after(consumer):
                wrapped = graph.call_function(resharded.refill, (consumer, gathered, shard, partners[consumer]))
            consumer.replace_all_uses_with(wrapped, delete_user_cb=lambda user: user is not wrapped)
            wrapped.meta["passthrough"] = True  # read by verify: same layout and shape as its first argument
        with graph.inserting_after(_last({u for a in aliases for u in a.users})):
            graph.call_function(resharded.release, (gathered,))
        released += 1
    return released


def regathered(value: torch.fx.Node, needs_grad=None) -> bool:
    """Whether this pass gathers `value` again in backward: the one rule of the emitted program and of its price
    (`planner.costs.Pricer.regathers`, which applies it to a parameter's placeholder in the traced graph, whose
    users are the ops its gathered copy feeds). True when no use could see the freed storage and some op reading
    it (or a view of it) may save it for backward (`cost_model.memory.may_save_arg`: a linear's weight, a
    layer norm's weight and bias); False for a value only added (a bias), looked up (an embedding table), or
    kept (module docstring). `needs_grad(node)`: whether a node of the graph requires grad (a product keeps the
    value only for a partner that does: a first layer's weight is not kept); None: unknown, the upper answer.

    Round 20 (r20c): until then every parameter all-gather was priced with its backward re-gather while the
    program re-gathered only these: on 4 gloo ranks an FSDP step of the bench's MLP ran 31 collectives and was
    priced 37 (12 re-gathers priced, 6 emitted), GPT-2 52 priced, 35 emitted, Llama 21 priced, 20 emitted."""
    return bool(_refilled(value, needs_grad)[1])


def backward_readers(value: torch.fx.Node, needs_grad=None) -> dict[torch.fx.Node, list[torch.fx.Node]]:
    """Per direct user u of `value`: the ops that may read `value` in backward through u (u itself, or the ops
    reading a view that u makes): the consumers this pass refills (module docstring, step 2); {} when `value` is
    kept. The program's gathered value lives in backward from the first of them to run (the last in graph order)
    to the end of the last one's backward (step 3): `planner.peak` prices it so, applied to a parameter's
    placeholder in the traced graph. `needs_grad` as `regathered`'s."""
    readers: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for consumer, via in _refilled(value, needs_grad)[1]:
        readers.setdefault(via, []).append(consumer)
    return readers


def _refilled(gathered: torch.fx.Node, needs_grad=None) -> tuple[list[torch.fx.Node],
                                                                  list[tuple[torch.fx.Node, torch.fx.Node]]]:
    """(G and its views, (op reading them that may save them for backward, the direct user of G it is reached
    through)); ([], []) when G is kept. `needs_grad(node)`: whether an fx node requires grad (None: unknown)."""
    aliases, consumers = _uses(gathered)
    if aliases is None:
        return [], []
    def arg_needs_grad(c: torch.fx.Node):
        if needs_grad is None:
            return None
        return lambda j: j < len(c.args) and isinstance(c.args[j], torch.fx.Node) and bool(needs_grad(c.args[j]))
    return aliases, [(c, via) for c, via in consumers
                     if any(may_save_arg(c.target, i, arg_needs_grad(c)) for i, a in enumerate(c.args) if a in aliases)]


def _partners(consumer: torch.fx.Node, aliases: list[torch.fx.Node]) -> tuple | None:
    """The args of `consumer` whose requiring grad makes it keep G (read at the positions of `aliases`): the
    union of `cost_model.memory.save_partners` over those positions; None when one of them keeps G whatever
    requires grad."""
    found: list = []
    for i, a in enumerate(consumer.args):
        if a in aliases:
            partners = save_partners(consumer.target, i)
            if partners is None:
                return None
            found += [consumer.args[j] for j in partners if j < len(consumer.args)]
    return tuple(found)


def _is_parameter_gather(node: torch.fx.Node, parameters: set[torch.fx.Node]) -> bool:
    step = node.meta.get("step")
    if step is None or step.kind != "all_gather" or not step.regather:
        return False
    while node.meta.get("step") is not None:
        node = node.args[0]
    return node in parameters


def _chain(gathered: torch.fx.Node) -> tuple[tuple[tuple[Callable, tuple], ...], torch.fx.Node]:
    """The steps from the parameter placeholder to `gathered` (each: function, arguments after the tensor)."""
    steps, node = [], gathered
    while node.meta.get("step") is not None:
        steps.append((node.target, tuple(node.args[1:])))
        node = node.args[0]
    return tuple(reversed(steps)), node


def _uses(gathered: torch.fx.Node) -> tuple[list[torch.fx.Node] | None, list[tuple[torch.fx.Node, torch.fx.Node]]]:
    """(G and its views, (op that reads them and returns a fresh tensor, the direct user of G it is reached
    through)), or (None, []) when some use could see the freed storage (module docstring)."""
    aliases, consumers, todo = [gathered], [], [(gathered, None)]
    while todo:
        node, via = todo.pop()
        for user in list(node.users):
            root = via or user
            if user.op == "output" or mutated_args(user) or user.meta.get("step") is not None:
                return None, []
            if may_alias(user):  # a declared view, or an op that returns its input or a view for some arguments
                # (einsum('ii->i') of a gathered weight: releasing G after its last direct reader freed the
                # storage that the einsum's later readers still read: SIGSEGV on fsdp, r18a)
                aliases.append(user)
                todo.append((user, root))
                if is_view(user) or user.target is operator.getitem:
                    continue
            if not isinstance(user.target, torch._ops.OpOverload):
                return None, []
            if is_view(user):
                continue
            elif _returns_one_tensor(user):
                consumers.append((user, root))
            else:
                return None, []
    return aliases, consumers


def _returns_one_tensor(node: torch.fx.Node) -> bool:
    returns = node.target._schema.returns
    return len(returns) == 1 and str(returns[0].type) == "Tensor"


def _last(nodes: set[torch.fx.Node]) -> torch.fx.Node:
    """The node of `nodes` that comes last in its graph."""
    graph = next(iter(nodes)).graph
    return next(n for n in reversed(graph.nodes) if n in nodes)
