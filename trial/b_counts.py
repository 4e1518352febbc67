"""Part (b): where `show`'s redistribution-step counts and rehearse's `collectives` differ (GPT-2 dp=2 x tp=2)."""
import sys
from collections import Counter
import parallelizer
from parallelizer.planner.plan import Plan
from parallelizer import zoo

plan = Plan.load(sys.argv[1])
from parallelizer import presets
model, inputs, *kw = presets.build(plan.model["recipe"], "cpu")
traced = parallelizer.trace(model, inputs, *kw)
show = Counter(s.kind for _, s in plan.steps())
print("show (plan edges):", dict(show))
for r in range(plan.mesh.world_size):
    prog = parallelizer.rewrite(traced, plan, rank=r)
    print("rank", r, "emitted:", dict(prog.collectives))
prog = parallelizer.rewrite(traced, plan, rank=0)
emitted = Counter()
for n in prog.graph_module.graph.nodes:
    st = n.meta.get("step")
    if st is not None and n.op == "call_function" and "div" not in str(n.target):
        emitted[(st.kind, st.mesh_axis)] += 1
planned = Counter((s.kind, s.mesh_axis) for _, s in plan.steps())
print("per (kind, axis) planned vs emitted on rank 0:")
for k in sorted(set(planned) | set(emitted)):
    print("  ", k, planned[k], emitted[k])
# which plan edges share a (source, target layout)
seen = Counter((e.src, e.dst_layout if hasattr(e, 'dst_layout') else None) for e in plan.edges if e.steps)
print("edge fields:", [f for f in dir(plan.edges[0]) if not f.startswith('_')])
keys = Counter((e.src, e.dst_layout) for e in plan.edges if any(s.kind == "all_gather" and s.mesh_axis == "dp" for s in e.steps))
print("all_gather dp edges sharing a (source, target layout):", {k: v for k, v in keys.items() if v > 1})
for n in prog.graph_module.graph.nodes:
    st = n.meta.get("step")
    if st is not None and st.kind == "local_slice":
        print("  emitted local_slice", n.name, "of", n.args[0], st.mesh_axis)
for e in plan.edges:
    for s in e.steps:
        if s.kind == "local_slice":
            print("  planned local_slice", e.src, "->", e.dst, s.mesh_axis)
