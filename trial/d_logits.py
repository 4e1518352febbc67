"""Part (d): what the planner does with GPT-2's logits on tp=2, with and without labels=."""
import contextlib, io
import parallelizer
from parallelizer import zoo

for labels in (False, True):
    out = zoo.gpt2(n_layer=2, n_embd=768, n_head=12, vocab_size=50257, batch=8, seq_len=1024, device="meta", labels=labels)
    model, inputs, *kw = out
    tg = parallelizer.trace(model, inputs, *kw)
    for roles in ({"tp": "tp"}, {}):
        with contextlib.redirect_stdout(io.StringIO()):
            p = parallelizer.plan(tg, {"tp": 2}, axis_roles=roles)
        print(f"== labels={labels} roles={roles}: output layout(s)", [e.src_layout + "->" + e.dst_layout for e in p.edges if e.dst == "output"])
        for e in p.edges:
            for s in e.steps:
                if s.kind in ("all_gather", "all_to_all") and (s.nbytes or 0) > 50e6:
                    print("   big", s.kind, s.mesh_axis, e.src, "->", e.dst, e.shape, f"{s.nbytes/1e6:.0f} MB")
        ce = [n for n, x in p.nodes.items() if "cross_entropy" in x.op or "log_softmax" in x.op or "nll" in x.op]
        for n in ce:
            print("   ", n, p.nodes[n].op, p.nodes[n].strategy)
        for note in p.notes():
            print("   NOTE", note[:300])
