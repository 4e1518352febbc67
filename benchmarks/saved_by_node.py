"""Bytes kept for backward, per op: what the planner prices vs what autograd really keeps (issue 13 item 5).

For a traced model (`parallelizer.trace`) on one device:

- priced (`priced_saved_bytes`): the bytes each op node is priced to keep for backward, exactly as the planner
  prices an unsharded op (`planner.costs.Pricer`: `cost_model.memory.saved_activation_bytes` with the node's
  `saved_share` (each storage charged to its first saver) and `grad_args` (which of its args require grad));
- held (`held_saved_bytes`): the traced program (`TracedGraph.exported.module()`, the ATen graph the rewriter
  emits per rank) run eagerly op by op under `torch.autograd.graph.saved_tensors_hooks`; every storage a saved
  tensor lives on is charged, whole and once, to the op during which it was FIRST saved; parameter and buffer
  storages to nobody (as `benchmarks._memory_workers` measures a rank, and as the price charges storages).

`compare` lists the nodes whose two figures differ, and their sum by op kind. Run
`python -m benchmarks.saved_by_node` for the zoo's transformers models (RESULTS.md, Round 23 (r23e)).
"""
from __future__ import annotations

import collections
import operator

import torch
import torch.fx

from cost_model._fx import node_values, op_nodes
from cost_model.memory import saved_activation_bytes
from parallelizer.config import PlanConfig
from parallelizer.core.mesh import MeshSpec
from cost_model.topology import MeshTopology
from parallelizer.planner.api import resolve_cluster
from parallelizer.planner.costs import Pricer
from parallelizer.tracer import TracedGraph

__all__ = ["priced_saved_bytes", "held_saved_bytes", "compare", "rank_held_saved_bytes", "WEIGHT_COPIES"]

_VIEW_FNS = {f"{op}Backward0" for op in ("T", "View", "UnsafeView", "Transpose", "Permute", "Expand", "Unsqueeze",
                                          "Squeeze", "Alias", "AsStrided", "Slice", "Select", "Reshape")}
WEIGHT_COPIES = "<bf16 weight copies>"  # `rank_held_saved_bytes`' key for autocast's saved copies of parameters


def _pricer(tg: TracedGraph) -> Pricer:
    """The planner's Pricer of one device (`resolve_cluster(None, 1)`, as `parallelizer.plan` resolves it), fp32."""
    mesh = MeshSpec(("dp",), (1,))
    return Pricer(MeshTopology(resolve_cluster(None, 1)[0], mesh.shape, mesh.axis_names), mesh,
                  PlanConfig(precision="fp32"), tg)


def priced_saved_bytes(tg: TracedGraph) -> dict[str, int]:
    """{node name: bytes the planner prices the op to keep for backward} for every op whose backward runs
    (fp32 as traced, one device: local shapes = global shapes)."""
    pricer = _pricer(tg)
    live = pricer._saved_facts(tg)[2]
    resident = {ph for p in tg.parameters.values() for ph in p.placeholders}
    out = {}
    for node in op_nodes(tg.graph_module):
        if node.name not in live or node.target is operator.getitem:
            continue
        args, kwargs, val = node_values(node)
        params = {i for i, a in enumerate(node.args) if isinstance(a, torch.fx.Node) and a.name in resident}
        out[node.name] = saved_activation_bytes(node.target, args, kwargs, val, param_args=params,
                                                share=pricer.saved_share(tg, node.name),
                                                grad_args=pricer.grad_args(tg, node.name))
    return out


class _Recorder(torch.fx.Interpreter):
    """Runs a graph node by node and charges each storage saved for backward to the node that saved it first.

    Under the bf16 autocast recipe a saved tensor that is autocast's bf16 copy of a parameter (its grad_fn a
    ToCopyBackward0 whose source is a parameter, or a value the program made from parameters alone by an emitted
    step: an FSDP all-gather) is not an activation: it is the 2 B/param weight copy `cost_model.memory`'s bf16 table
    counts with the parameters; its bytes go to `weight_copies` instead."""

    def __init__(self, module: torch.fx.GraphModule, resident: set[int], state: tuple = ()) -> None:
        super().__init__(module)
        self.current, self.resident = "", resident
        # storage pointer -> (node name, storage): its bytes are read when forward is done (`held_bytes`)
        self.owner: dict[int, tuple[str, torch.UntypedStorage]] = {}
        self.derived = {id(t) for t in state}  # parameters and what emitted steps made of them alone
        self.param_fns: set[int] = set()  # grad_fns of those values (sources of autocast's weight copies)
        self.weight_copies = 0
        self.derived_storages: set[int] = set()  # their storages (by StorageImpl: FSDP frees a gathered one's
        # memory after use, and the allocator gives its address to an activation)
        self.keep: list[torch.Tensor] = []  # derived values kept alive: a freed one's id or storage could be reused

    def run_node(self, n: torch.fx.Node):
        self.current = n.name
        out = super().run_node(n)
        ins = [a for a in torch.utils._pytree.tree_leaves((self.map_nodes_to_values(n.args, n),
                                                           self.map_nodes_to_values(n.kwargs, n)))
               if isinstance(a, torch.Tensor)]
        if ins and "source" not in n.meta and all(id(a) in self.derived for a in ins) and \
                isinstance(out, torch.Tensor):
            self.derived.add(id(out))
            self.keep.append(out)
            self.derived_storages.add(out.untyped_storage()._cdata)  # a gathered parameter: priced with the state
            if out.grad_fn is not None:
                self.param_fns.add(id(out.grad_fn))
        return out

    def _weight_copy(self, t: torch.Tensor) -> bool:
        fn = t.grad_fn
        while fn is not None and type(fn).__name__ in _VIEW_FNS and fn.next_functions:
            fn = fn.next_functions[0][0]  # a view of the copy (linear saves weight.t(), matmul a reshape)
        if fn is None or type(fn).__name__ != "ToCopyBackward0" or not fn.next_functions:
            return False
        src = fn.next_functions[0][0]
        return src is not None and (id(src) in self.param_fns or id(getattr(src, "variable", None)) in self.derived)

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self.resident and ptr not in self.owner and storage.nbytes() and \
                storage._cdata not in self.derived_storages:
            if self._weight_copy(t):
                self.resident.add(ptr)
                self.weight_copies += storage.nbytes()
            else:
                self.owner[ptr] = (self.current, storage)
        return t

    def held_bytes(self) -> dict[str, int]:
        """{node: bytes of the storages it saved first, as they stand now}: read after forward, so a storage the
        program released before its backward (a gathered FSDP parameter, `rewriter.reshard`: resized to 0 after its
        last forward use, gathered again in backward) holds nothing (round 25, r25d: read at save time, the fsdp x tp
        Llama's rank held its gathered weights, +8,192 B on one linear, which no rank keeps)."""
        held: dict[str, int] = collections.defaultdict(int)
        for name, storage in self.owner.values():
            held[name] += storage.nbytes()
        return dict(held)


def held_saved_bytes(tg: TracedGraph, inputs: tuple, kwargs: dict | None = None) -> dict[str, int]:
    """{node name: bytes of the storages autograd keeps whose first saver is that node} from one eager forward of
    the traced program on `inputs` / `kwargs` (the call the model was traced with; module docstring)."""
    module = tg.exported.module()
    resident = {t.untyped_storage().data_ptr() for t in (*module.parameters(), *module.buffers())}
    recorder = _Recorder(module, resident)
    flat = [*inputs, *(kwargs or {}).values()]
    with torch.autograd.graph.saved_tensors_hooks(recorder.pack, lambda t: t):
        recorder.run(*flat)
    return recorder.held_bytes()


def compare(tg: TracedGraph, inputs: tuple, kwargs: dict | None = None) -> dict:
    """{"priced": total, "held": total, "nodes": [(node, op, priced, held) where they differ],
    "ops": {op: (nodes, priced, held)} summed over those nodes}."""
    priced, held = priced_saved_bytes(tg), held_saved_bytes(tg, inputs, kwargs)
    nodes = {n.name: n for n in tg.graph_module.graph.nodes}
    differ = [(name, str(nodes[name].target), priced.get(name, 0), held.get(name, 0))
              for name in nodes if priced.get(name, 0) != held.get(name, 0)]
    differ += [(name, "?", 0, b) for name, b in held.items() if name not in nodes]
    ops: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for _, op, p, h in differ:
        ops[op][0] += 1
        ops[op][1] += p
        ops[op][2] += h
    return {"priced": sum(priced.values()), "held": sum(held.values()), "nodes": differ,
            "ops": {op: tuple(v) for op, v in ops.items()}}


if __name__ == "__main__":
    import parallelizer
    from parallelizer.zoo import families, hf

    cases = {"llama (eager attention, 8 x 64)": hf.llama(batch=8, seq_len=64, labels=True, returns="loss"),
             "gpt2 tied (eager, 8 x 64)": hf.gpt2(batch=8, seq_len=64, labels=True),
             **{f"{name} (family defaults, SDPA)": getattr(families, name)()
                for name in ("llama", "mixtral", "gpt2", "bert", "vit")}}
    for label, (model, inputs, *rest) in cases.items():
        kw = rest[0] if rest else {}
        res = compare(parallelizer.trace(model, inputs, kw), inputs, kw)
        gap = res["priced"] - res["held"]
        print(f"{label}: priced {res['priced']:,} held {res['held']:,} ({gap / max(res['held'], 1):+.2%})")
        for op, (count, p, h) in sorted(res["ops"].items(), key=lambda kv: -abs(kv[1][1] - kv[1][2])):
            print(f"    {op}: {count} nodes, priced {p:,} held {h:,} ({p - h:+,})")


def rank_held_saved_bytes(rank: int, world_size: int, cases: list[tuple]) -> list[dict[str, int]]:
    """For each (model_fn, model_kwargs, spec) case: {traced node name: bytes of the storages autograd keeps whose
    first saver is that node} on THIS rank: its emitted program (`ParallelModule`, gradient buckets off) run op by op
    under saved-tensor hooks as `held_saved_bytes` runs the traced one, inside the plan's mixed-precision context
    (`ParallelModule._autocast`: torch.autocast(cpu, bf16) under the bf16 recipe; autocast's saved bf16 copies of
    parameters summed under `WEIGHT_COPIES`, `_Recorder`); an emitted op is charged to the traced node it
    stands for (`meta["source"]`), a collective under its own name; parameter and buffer storages to nobody.
    Spawned per rank (`runtime.launch.spawn`); the priced side is `planner.local_storage.local_saved_bytes`."""
    from parallelizer.rewriter.spec import all_axis_groups
    from parallelizer.runtime.launch import create_groups
    from parallelizer.runtime.module import ParallelModule
    from parallelizer.tracer.trace import trace

    out = []
    for model_fn, model_kwargs, spec in cases:
        model, inputs, *rest = model_fn(**model_kwargs)
        kwargs = rest[0] if rest else {}
        traced = trace(model, inputs, kwargs)
        create_groups(all_axis_groups(spec.mesh))
        pm = ParallelModule(traced, spec, rank, model, grad_bucket_bytes=0)
        state = pm._state()
        program = pm.program.graph_module
        recorder = _Recorder(program, {t.untyped_storage().data_ptr() for t in state}, tuple(state))
        with torch.autograd.graph.saved_tensors_hooks(recorder.pack, lambda t: t), pm._autocast(state):
            recorder.run(*state, *traced.tensor_inputs(inputs, kwargs))
        source = {n.name: n.meta.get("source", n.name) for n in program.graph.nodes}
        held: dict[str, int] = collections.defaultdict(int)
        for name, nbytes in recorder.held_bytes().items():
            held[source.get(name, name)] += nbytes
        if recorder.weight_copies:
            held[WEIGHT_COPIES] = recorder.weight_copies
        out.append({n: b for n, b in held.items() if b})
    return out
