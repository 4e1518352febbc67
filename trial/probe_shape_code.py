"""Probe: training-loop code over pm.parameters() that reads shapes/whole tensors, vs one device (2 ranks).
ema_of_original: ema = deepcopy(ORIGINAL model), ema_p.lerp_(p) over zip(ema.parameters(), pm.parameters());
v2p_from_model: vector_to_parameters(parameters_to_vector(model.parameters()) * 0.5, pm.parameters());
sam: SAM perturbation with the grad norm taken by hand over pm's grads."""
import contextlib, copy, io, sys, traceback
import torch
from torch import nn
import torch.distributed as dist
import parallelizer
from parallelizer import zoo
from parallelizer.rewriter.spec import spec_from_plan, all_axis_groups
from parallelizer.runtime import spawn, create_groups
from parallelizer.runtime.module import ParallelModule
from parallelizer.tracer.trace import trace
from torch.nn.utils import parameters_to_vector, vector_to_parameters

SIZES = dict(batch=8, in_features=16, dim=32, hidden=64, out_features=4)


def sam_step(m, x, opt, rho=0.05, total=False):
    m(x).pow(2).mean().backward()
    if total:
        norm = torch.nn.utils.get_total_norm([p.grad for p in m.parameters() if p.grad is not None])
    else:
        norm = torch.norm(torch.stack([p.grad.norm(2) for p in m.parameters() if p.grad is not None]), 2)
    eps = []
    with torch.no_grad():
        for p in m.parameters():
            e = rho * p.grad / (norm + 1e-12); p.add_(e); eps.append(e)
    opt.zero_grad()
    m(x).pow(2).mean().backward()
    with torch.no_grad():
        for p, e in zip(m.parameters(), eps):
            p.sub_(e)
    opt.step(); opt.zero_grad()


def one(name, spec):
    model, (x,) = zoo.mlp(**SIZES)
    ref = copy.deepcopy(model)
    original = copy.deepcopy(model)
    create_groups(all_axis_groups(spec.mesh))
    pm = ParallelModule(trace(model, (x,)), spec, dist.get_rank(), model)
    order_same = [n for n, _ in pm.named_parameters()] == [n for n, _ in ref.named_parameters()]
    try:
        opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (pm, ref)]
        if name == "ema_of_original":
            emas = [copy.deepcopy(original), copy.deepcopy(original)]
            for _ in range(3):
                for m, opt, ema in zip((pm, ref), opts, emas):
                    m(x).pow(2).mean().backward(); opt.step(); opt.zero_grad()
                    with torch.no_grad():
                        for e, p in zip(ema.parameters(), m.parameters()):
                            e.lerp_(p, 0.1)
            return f"order_same={order_same} ema diff {(emas[0](x) - emas[1](x)).abs().max().item():.3g}"
        if name == "v2p_from_model":
            v = parameters_to_vector(original.parameters()) * 0.5
            for m in (pm, ref):
                vector_to_parameters(v, m.parameters())
        if name in ("sam", "sam_total_norm"):
            for _ in range(3):
                for m, opt in zip((pm, ref), opts):
                    sam_step(m, x, opt, total=name == "sam_total_norm")
        else:
            for _ in range(3):
                for m, opt in zip((pm, ref), opts):
                    m(x).pow(2).mean().backward(); opt.step(); opt.zero_grad()
        return f"order_same={order_same} diff {(pm(x) - ref(x)).abs().max().item():.3g}"
    except Exception as e:
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return f"{type(e).__name__} @{tb.filename.split('/')[-1]}:{tb.lineno}: {str(e)[:200]}"


def body(rank, world, specs, names):
    return {(s, n): one(n, spec) for s, spec in specs.items() for n in names}


def spec_of(mesh, roles):
    model, inputs = zoo.mlp(**SIZES)
    with contextlib.redirect_stdout(io.StringIO()):
        return spec_from_plan(parallelizer.plan(parallelizer.trace(model, inputs), mesh, axis_roles=roles))


if __name__ == "__main__":
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else ["ema_of_original", "v2p_from_model", "sam"]
    specs = {"ddp2": spec_of({"dp": 2}, {"dp": "ddp"}), "fsdp2": spec_of({"dp": 2}, {"dp": "fsdp"}),
             "tp2": spec_of({"tp": 2}, {"tp": "tp"})}
    res = spawn(body, 2, specs, names, timeout_s=900)
    for key in res[0]:
        print(key, "|", res[0][key], "|| r1:", res[1][key] if res[1][key] != res[0][key] else "same")
