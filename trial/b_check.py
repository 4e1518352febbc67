import sys, contextlib, io
from collections import Counter
import parallelizer
from parallelizer import zoo

def check(tag, traced, mesh, **kw):
    with contextlib.redirect_stdout(io.StringIO()):
        p = parallelizer.plan(traced, mesh, **kw)
    mine = Counter()
    for (k, a), n in p.program_steps().items():
        mine[k] += n
    edges = Counter(s.kind for _, s in p.steps())
    for r in range(p.mesh.world_size):
        got = parallelizer.rewrite(traced, p, rank=r).collectives
        print(tag, "rank", r, "ok" if dict(mine) == got else f"DIFF program_steps {dict(mine)} rewriter {got}", "edges", dict(edges))

model, inputs, kw = zoo.gpt2(n_layer=2, n_embd=64, n_head=4, vocab_size=256, batch=4, seq_len=16, labels=True)
g = parallelizer.trace(model, inputs, kw)
check("gpt2 fsdp,tp", g, {"dp": 2, "tp": 2}, axis_roles={"dp": "fsdp", "tp": "tp"})
check("gpt2 tp", g, {"tp": 2}, axis_roles={"tp": "tp"})
check("gpt2 ddp", g, {"dp": 2}, axis_roles={"dp": "ddp"})
check("gpt2 free 4", g, {"dp": 4})
m, i = zoo.mlp(depth=2, batch=6, dim=16, hidden=32, in_features=8)
g2 = parallelizer.trace(m, i)
check("mlp fsdp 4", g2, {"dp": 4}, axis_roles={"dp": "fsdp"})
check("mlp tp 3", g2, {"tp": 3}, axis_roles={"tp": "tp"})
