"""Probe: model surgery / shape-reading code on a ParallelModule AFTER wrapping vs the same on one device.
Each case mutates (pm, ref) alike, then 3 SGD steps; prints the max output diff or the error."""
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
import torch.nn.utils.prune as prune

SIZES = dict(batch=8, in_features=16, dim=32, hidden=64, out_features=4)


class MyLinear(nn.Linear):
    """a user's replacement: a Linear whose forward rounds the weight (fake quantisation)"""
    def forward(self, x):
        w = self.weight + (torch.round(self.weight * 8) / 8 - self.weight).detach()
        return nn.functional.linear(x, w, self.bias)


def swap(m):
    old = m.blocks[0].up
    new = MyLinear(old.in_features, old.out_features)
    new.weight, new.bias = old.weight, old.bias
    m.blocks[0].up = new


def hand_mask(m):
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.mul_(p.abs() > p.abs().quantile(0.5))


def tie(m):
    m.blocks[1].up.weight = m.blocks[0].up.weight


def qat(m):
    m.qconfig = torch.ao.quantization.get_default_qat_qconfig("fbgemm")
    torch.ao.quantization.prepare_qat(m, inplace=True)


def lin_weights(m):
    return [(mod, "weight") for mod in m.modules() if isinstance(mod, nn.Linear)]


def data_full(m):
    full = torch.ones(4, 32) * 0.01
    m.head.weight.data = full


def qdyn(m):
    return torch.ao.quantization.quantize_dynamic(m, {nn.Linear}, dtype=torch.qint8)


CASES = {
    "data_full": data_full,
    "new_param_full": lambda m: setattr(m.blocks[0].up, "weight", nn.Parameter(torch.ones(64, 32) * 0.01)),
    "prune_l1": lambda m: prune.l1_unstructured(m.blocks[0].up, "weight", amount=0.5),
    "prune_ln": lambda m: prune.ln_structured(m.blocks[0].up, "weight", amount=0.5, n=2, dim=0),
    "prune_global": lambda m: prune.global_unstructured(lin_weights(m), pruning_method=prune.L1Unstructured, amount=0.5),
    "hand_mask": hand_mask,
    "swap_mylinear": swap,
    "head_identity": lambda m: setattr(m, "head", nn.Identity()),
    "del_block": lambda m: m.blocks.__delitem__(1),
    "tie_after": tie,
    "prepare_qat": qat,
    "new_param_scaled": lambda m: setattr(m.head, "weight", nn.Parameter(m.head.weight.detach() * 2)),
}


def one(rank, world, name, spec):
    model, (x,) = zoo.mlp(**SIZES)
    ref = copy.deepcopy(model)
    create_groups(all_axis_groups(spec.mesh))
    pm = ParallelModule(trace(model, (x,)), spec, dist.get_rank(), model)
    if name == "quantize_dynamic":
        try:
            q_ref = qdyn(ref.eval()); pm.eval()
            q_pm = qdyn(pm)
            return f"diff {(q_pm(x) - q_ref(x)).abs().max().item():.3g}"
        except Exception as e:
            return f"{type(e).__name__}: {str(e)[:250]}"
    try:
        CASES[name](ref)
    except Exception as e:
        return f"eager itself raises {type(e).__name__}"
    try:
        CASES[name](pm)
        opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (pm, ref)]
        for _ in range(3):
            for m, opt in zip((pm, ref), opts):
                m(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
        a, b = pm(x), ref(x)
        return f"diff {(a - b).abs().max().item():.3g}"
    except Exception as e:
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return f"{type(e).__name__} @{tb.filename.split('/')[-1]}:{tb.lineno}: {str(e)[:300]}"


def body(rank, world, specs, names):
    return {(s, n): one(rank, world, n, spec) for s, spec in specs.items() for n in names}


def spec_of(mesh, roles):
    model, inputs = zoo.mlp(**SIZES)
    with contextlib.redirect_stdout(io.StringIO()):
        return spec_from_plan(parallelizer.plan(parallelizer.trace(model, inputs), mesh, axis_roles=roles))


if __name__ == "__main__":
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else list(CASES) + ["quantize_dynamic"]
    specs = {"ddp2": spec_of({"dp": 2}, {"dp": "ddp"}), "fsdp2": spec_of({"dp": 2}, {"dp": "fsdp"}),
             "tp2": spec_of({"tp": 2}, {"tp": "tp"})}
    res = spawn(body, 2, specs, names, timeout_s=900)
    for key in res[0]:
        print(key, "|", res[0][key], "|| r1:", res[1][key] if res[1][key] != res[0][key] else "same")
