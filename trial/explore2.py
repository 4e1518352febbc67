"""More contract probes: sparse embedding, meta init, attributes set in forward, buffer writes, GPT-2 grads."""
import contextlib, copy, io, sys, traceback, warnings
import torch
import torch.distributed as dist
from torch import nn

import parallelizer
from parallelizer import zoo
from parallelizer.rewriter.spec import spec_from_plan, all_axis_groups
from parallelizer.runtime import create_groups, spawn
from parallelizer.runtime.module import ParallelModule
from parallelizer.tracer.trace import trace
sys.path.insert(0, __file__.rpartition("/")[0])
from explore import shard, diff, grads_diff, params_diff


class SparseEmb(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16, sparse=True)
        self.head = nn.Linear(16, 4)
    def forward(self, ids):
        return self.head(self.emb(ids).mean(1))


class Temp(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)
        self.register_buffer("temperature", torch.tensor(1.0))
        self.register_buffer("mask", torch.ones(32))
    def forward(self, x):
        h = torch.relu(self.a(x)) * self.mask
        self.last_h = h.detach()   # attribute read after forward
        return self.b(h) / self.temperature


def sparse_emb():
    torch.manual_seed(0)
    return SparseEmb(), (torch.randint(0, 50, (8, 6)),)


def temp():
    torch.manual_seed(0)
    return Temp(), (torch.randn(8, 16),)


def make(builder, spec, device=None):
    model, inputs = builder()
    create_groups(all_axis_groups(spec.mesh))
    return model, inputs


def p_sparse_sgd(spec):
    model, (ids,) = sparse_emb(); ref = copy.deepcopy(model)
    create_groups(all_axis_groups(spec.mesh))
    pm = ParallelModule(trace(model, (ids,)), spec, dist.get_rank(), model)
    for m in (pm, ref):
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        for _ in range(2):
            m(ids).pow(2).mean().backward(); opt.step(); opt.zero_grad()
    return ("sparse grad?", params_diff(pm, ref))


def p_sparse_adam(spec):
    model, (ids,) = sparse_emb(); ref = copy.deepcopy(model)
    create_groups(all_axis_groups(spec.mesh))
    pm = ParallelModule(trace(model, (ids,)), spec, dist.get_rank(), model)
    out = []
    for m in (pm, ref):
        opt = torch.optim.SparseAdam([m.emb.weight], lr=0.1)
        m(ids).pow(2).mean().backward(); out.append(m.emb.weight.grad.is_sparse); opt.step()
    return (out, params_diff(pm, ref))


def p_buffer_write(spec):
    model, (x,) = temp(); ref = copy.deepcopy(model)
    create_groups(all_axis_groups(spec.mesh))
    pm = ParallelModule(trace(model, (x,)), spec, dist.get_rank(), model)
    outs = []
    for m in (pm, ref):
        m(x)
        m.temperature.fill_(2.0)                      # in place via attribute
        m.state_dict()["mask"][:8] = 0.0              # through state_dict
        o1 = m(x)
        m.temperature = torch.tensor(4.0)             # reassign attribute
        o2 = m(x)
        outs.append((o1, o2))
    return (diff(outs[0][0], outs[1][0]), diff(outs[0][1], outs[1][1]))


def p_attr_after_forward(spec):
    model, (x,) = temp(); ref = copy.deepcopy(model)
    create_groups(all_axis_groups(spec.mesh))
    pm = ParallelModule(trace(model, (x,)), spec, dist.get_rank(), model)
    pm(x); ref(x)
    return diff(pm.last_h, ref.last_h)


def p_meta_init(spec):
    """FSDP2 / torchtitan: build on meta, parallelize, to_empty, init."""
    torch.manual_seed(0)
    with torch.device("meta"):
        model = zoo.mlp(in_features=16, dim=32, hidden=64, out_features=4, device="meta")[0]
    x = torch.randn(8, 16)
    create_groups(all_axis_groups(spec.mesh))
    pm = ParallelModule(trace(model, (x,)), spec, dist.get_rank(), model)
    pm.to_empty(device="cpu")
    def init(m):
        if isinstance(m, nn.Linear):
            nn.init.constant_(m.weight, 0.01); nn.init.zeros_(m.bias)
    pm.apply(init)
    ref = zoo.mlp(in_features=16, dim=32, hidden=64, out_features=4)[0]; ref.apply(init)
    return diff(pm(x), ref(x))


def p_meta_reset_parameters(spec):
    torch.manual_seed(0)
    model = zoo.mlp(in_features=16, dim=32, hidden=64, out_features=4, device="meta")[0]
    x = torch.randn(8, 16)
    create_groups(all_axis_groups(spec.mesh))
    pm = ParallelModule(trace(model, (x,)), spec, dist.get_rank(), model)
    pm.to_empty(device="cpu")
    n = 0
    for m in pm.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters(); n += 1
    return ("reset_parameters called on", n, "finite:", all(torch.isfinite(p).all().item() for p in pm.parameters()))


def p_gpt2_autograd_grad(spec):
    model, inputs = zoo.gpt2(n_layer=2, n_embd=32, n_head=2, vocab_size=100, batch=4, seq_len=8)
    ref = copy.deepcopy(model)
    create_groups(all_axis_groups(spec.mesh))
    pm = ParallelModule(trace(model, inputs), spec, dist.get_rank(), model)
    lp = pm(*inputs).logits.float().pow(2).mean(); lr = ref(*inputs).logits.pow(2).mean()
    gp = torch.autograd.grad(lp, list(pm.parameters())); gr = torch.autograd.grad(lr, list(ref.parameters()))
    names_pm = [n for n, _ in pm.named_parameters()]; names_ref = [n for n, _ in ref.named_parameters()]
    if names_pm != names_ref:
        return ("names differ", names_pm[:3], names_ref[:3], len(names_pm), len(names_ref))
    return grads_diff(pm, ref, gp, gr)


PROBES = {k[2:]: v for k, v in dict(globals()).items() if k.startswith("p_")}


def body(rank, world, specs):
    warnings.simplefilter("ignore")
    out = {}
    for (pname, sname), spec in specs.items():
        try:
            out[(sname, pname)] = ("ok", PROBES[pname](spec))
        except Exception as e:
            out[(sname, pname)] = ("raise", f"{type(e).__module__}.{type(e).__name__}: {str(e)[:300]}",
                                   traceback.format_exc()[-2500:])
        dist.barrier()
    return out


def spec_for(builder, mesh, roles):
    model, inputs = builder()
    with contextlib.redirect_stdout(io.StringIO()):
        return spec_from_plan(parallelizer.plan(parallelizer.trace(model, inputs), mesh, axis_roles=roles))


if __name__ == "__main__":
    meshes = {"ddp": ({"dp": 2}, {"dp": "ddp"}), "fsdp": ({"dp": 2}, {"dp": "fsdp"}), "tp": ({"tp": 2}, {"tp": "tp"})}
    builders = {"sparse_sgd": sparse_emb, "sparse_adam": sparse_emb, "buffer_write": temp, "attr_after_forward": temp,
                "meta_init": lambda: zoo.mlp(in_features=16, dim=32, hidden=64, out_features=4),
                "meta_reset_parameters": lambda: zoo.mlp(in_features=16, dim=32, hidden=64, out_features=4),
                "gpt2_autograd_grad": lambda: zoo.gpt2(n_layer=2, n_embd=32, n_head=2, vocab_size=100, batch=4, seq_len=8)}
    only = sys.argv[1].split(",") if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else list(builders)
    specs = {}
    for pname in only:
        for sname, (mesh, roles) in meshes.items():
            try:
                specs[(pname, sname)] = spec_for(builders[pname], mesh, roles)
            except Exception as e:
                print((sname, pname), "PLAN raise", type(e).__name__, str(e)[:300])
    res = spawn(body, 2, specs, timeout_s=900)
    for key in res[0]:
        vals = [r[key] for r in res]
        print(key, vals[0][:2] if all(v[:2] == vals[0][:2] for v in vals) else [v[:2] for v in vals])
    if "-v" in sys.argv:
        for key, v in res[0].items():
            if v[0] == "raise":
                print("=====", key); print(v[2])
