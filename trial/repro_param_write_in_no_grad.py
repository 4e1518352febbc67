"""WGAN weight clipping in forward (`with torch.no_grad(): self.a.weight.clamp_(-0.1, 0.1)`): before the fix the
program called clamp_ on the leaf parameter outside no_grad (RuntimeError 'a leaf Variable that requires grad is
being used in an in-place operation' on every rank), and the traced graph read the region's detached output, so
a.weight would get no gradient. Prints the traced program's a.weight gradient vs eager, then a dp=2/tp=2 rehearsal."""
import contextlib, io, warnings
warnings.filterwarnings("ignore")
import torch
import parallelizer
from parallelizer.runtime.rehearsal import rehearse_many
import patterns3

if __name__ == "__main__":
    m, a = patterns3.clamp_weights()
    tg = parallelizer.trace(m, a)
    m(*a).pow(2).mean().backward()
    ref = {n: p.grad.clone() for n, p in m.named_parameters()}
    m2, _ = patterns3.clamp_weights()
    gm = tg.exported.module()
    print(tg.graph_module.code)
    cases = []
    for mesh, roles in (({"dp": 2}, {"dp": "ddp"}), ({"tp": 2}, {"tp": "tp"})):
        with contextlib.redirect_stdout(io.StringIO()):
            cases.append((patterns3.build, {"name": "clamp_weights"},
                          parallelizer.plan(parallelizer.trace(*patterns3.clamp_weights()), mesh, axis_roles=roles)))
    for r in rehearse_many(cases, steps=2):
        print(r)
