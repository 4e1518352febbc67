"""Training-loop contract exploration: user code around a ParallelModule vs eager, on several meshes."""
import contextlib, copy, io, sys, traceback, warnings
import torch
import torch.distributed as dist
from torch import nn

import parallelizer
from parallelizer import zoo
from parallelizer.rewriter.spec import spec_from_plan, all_axis_groups
from parallelizer.rewriter.state import shard_tensor
from parallelizer.runtime import create_groups, spawn
from parallelizer.runtime.module import ParallelModule
from parallelizer.tracer.trace import trace

SIZES = dict(batch=8, in_features=16, dim=32, hidden=64, out_features=4)


def build():
    model, (x,) = zoo.mlp(**SIZES)
    return model, x


def make_pm(model, x, spec):
    create_groups(all_axis_groups(spec.mesh))
    return ParallelModule(trace(model, (x,)), spec, dist.get_rank(), model)


def shard(pm, fqn, full):
    return shard_tensor(full, pm.spec.params[fqn], pm.spec.mesh, pm.coords)


def diff(a, b):
    return (a.detach().double() - b.detach().double()).abs().max().item() if a.numel() else 0.0


def grads_diff(pm, ref, grads_pm=None, grads_ref=None):
    ref_p = dict(ref.named_parameters())
    worst = 0.0
    for i, (f, p) in enumerate(pm.named_parameters()):
        g = p.grad if grads_pm is None else grads_pm[i]
        r = ref_p[f].grad if grads_ref is None else grads_ref[i]
        if (g is None) != (r is None):
            return f"grad presence differs at {f}: pm {g is None} eager {r is None}"
        if g is not None:
            worst = max(worst, diff(g, shard(pm, f, r)))
    return worst


def params_diff(pm, ref):
    ref_p = dict(ref.named_parameters())
    return max(diff(p, shard(pm, f, ref_p[f])) for f, p in pm.named_parameters())


# ------------------------------------------------------------------ experiments: fn(pm, ref, x) -> value
def e_autograd_grad(pm, ref, x):
    gp = torch.autograd.grad(pm(x).pow(2).mean(), list(pm.parameters()))
    gr = torch.autograd.grad(ref(x).pow(2).mean(), list(ref.parameters()))
    return grads_diff(pm, ref, gp, gr)


def e_backward_inputs(pm, ref, x):
    for m in (pm, ref):
        ps = [m.blocks[0].up.weight, m.head.bias]
        m(x).pow(2).mean().backward(inputs=ps)
    return grads_diff(pm, ref)


def e_retain_graph(pm, ref, x):
    for m in (pm, ref):
        out = m(x)
        out.pow(2).mean().backward(retain_graph=True)
        out.abs().sum().backward()
    return grads_diff(pm, ref)


def e_siamese(pm, ref, x):
    x2 = x.flip(0) * 0.5
    for m in (pm, ref):
        (m(x) - m(x2)).pow(2).mean().backward()
    return grads_diff(pm, ref)


def e_nograd_between(pm, ref, x):
    res = []
    for m in (pm, ref):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        m(x).pow(2).mean().backward(); opt.step(); opt.zero_grad()
        with torch.no_grad():
            a = m(x * 2)
        with torch.inference_mode():
            b = m(x * 3)
        m(x).pow(2).mean().backward(); opt.step()
        res.append((a, b))
    return max(diff(res[0][0], res[1][0]), diff(res[0][1], res[1][1]), params_diff(pm, ref), grads_diff(pm, ref))


def e_other_batch(pm, ref, x):
    return pm(x[:4]).shape


def e_opt_in_backward(pm, ref, x):
    for m in (pm, ref):
        opts = {p: torch.optim.SGD([p], lr=0.1) for p in m.parameters()}
        def hook(p):
            opts[p].step(); opts[p].zero_grad()
        for p in m.parameters():
            p.register_post_accumulate_grad_hook(hook)
        for _ in range(2):
            m(x).pow(2).mean().backward()
    return params_diff(pm, ref)


def e_grad_hook_scale(pm, ref, x):
    for m in (pm, ref):
        for p in m.parameters():
            p.register_hook(lambda g: g.clamp(-1e-3, 1e-3) * 0.5)
        m(x).pow(2).mean().backward()
    return grads_diff(pm, ref)


def e_functional_call(pm, ref, x):
    from torch.func import functional_call
    pp = {k: v * 1.5 for k, v in pm.named_parameters()}
    rp = {k: v * 1.5 for k, v in ref.named_parameters()}
    a = functional_call(pm, pp, (x,)); b = functional_call(ref, rp, (x,))
    d = diff(a, b)
    # gradient w.r.t. the given dict
    ga = torch.autograd.grad(a.pow(2).mean(), list(pp.values()))
    gb = torch.autograd.grad(b.pow(2).mean(), list(rp.values()))
    return max(d, grads_diff(pm, ref, ga, gb))


def e_func_grad(pm, ref, x):
    from torch.func import functional_call, grad
    def loss(m):
        return lambda params, x: functional_call(m, params, (x,)).pow(2).mean()
    ga = grad(loss(pm))({k: v.detach() for k, v in pm.named_parameters()}, x)
    gb = grad(loss(ref))({k: v.detach() for k, v in ref.named_parameters()}, x)
    return grads_diff(pm, ref, list(ga.values()), list(gb.values()))


def e_vmap_per_sample(pm, ref, x):
    from torch.func import functional_call, grad, vmap
    def per(m):
        params = {k: v.detach() for k, v in m.named_parameters()}
        f = lambda p, xi: functional_call(m, p, (xi.unsqueeze(0),)).pow(2).mean()
        return vmap(grad(f), in_dims=(None, 0))(params, x)
    ga, gb = per(pm), per(ref)
    return max(diff(a, b) for a, b in zip(ga.values(), gb.values()))


def e_jacrev(pm, ref, x):
    from torch.func import jacrev
    return diff(jacrev(pm)(x), jacrev(ref)(x))


def e_freeze_between(pm, ref, x):
    for m in (pm, ref):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        m(x).pow(2).mean().backward(); opt.step(); opt.zero_grad()
        m.blocks[0].up.weight.requires_grad_(False); m.proj.bias.requires_grad_(False)
        m(x).pow(2).mean().backward(); opt.step(); opt.zero_grad()
        m.blocks[0].up.weight.requires_grad_(True)
        m(x).pow(2).mean().backward(); opt.step()
    return max(params_diff(pm, ref), grads_diff(pm, ref))


def e_double(pm, ref, x):
    pm.double(); ref.double()
    a = pm(x.double()); b = ref(x.double())
    a.pow(2).mean().backward(); b.pow(2).mean().backward()
    return (str(a.dtype), diff(a, b), grads_diff(pm, ref))


def e_bf16(pm, ref, x):
    pm.to(torch.bfloat16); ref.to(torch.bfloat16)
    a = pm(x.bfloat16()); b = ref(x.bfloat16())
    return (str(a.dtype), diff(a, b))


def e_init_apply(pm, ref, x):
    n = [0]
    def init(m):
        if isinstance(m, nn.Linear):
            n[0] += 1
            nn.init.zeros_(m.bias); nn.init.constant_(m.weight, 0.01)
    pm.apply(init); ref.apply(init)
    return (n[0], diff(pm(x), ref(x)))


def e_init_orthogonal(pm, ref, x):
    torch.manual_seed(5)
    for p in pm.parameters():
        if p.dim() >= 2: nn.init.orthogonal_(p)
    torch.manual_seed(5)
    for p in ref.parameters():
        if p.dim() >= 2: nn.init.orthogonal_(p)
    return diff(pm(x), ref(x))


def e_init_zero_const(pm, ref, x):  # deterministic init on shards: fine
    for m in (pm, ref):
        for p in m.parameters():
            nn.init.constant_(p, 0.02) if p.dim() >= 2 else nn.init.zeros_(p)
    return diff(pm(x), ref(x))


def e_load_sd_subset(pm, ref, x):
    torch.manual_seed(9)
    other, _ = zoo.mlp(seed=9, **{k: v for k, v in SIZES.items() if k != "batch"})
    sd = {k: v for k, v in other.state_dict().items() if k.startswith("head.")}
    r1 = ref.load_state_dict(sd, strict=False)
    r0 = pm.load_state_dict(sd, strict=False)
    return (str(r0), diff(pm(x), ref(x)))


def e_load_full_sd_subset(pm, ref, x):
    other, _ = zoo.mlp(seed=9, **{k: v for k, v in SIZES.items() if k != "batch"})
    sd = {k: v for k, v in other.state_dict().items() if k.startswith("head.")}
    ref.load_state_dict(sd, strict=False)
    r0 = pm.load_full_state_dict(sd, strict=False)
    return diff(pm(x), ref(x))


def e_clamp_(pm, ref, x):
    for m in (pm, ref):
        with torch.no_grad():
            for p in m.parameters():
                p.clamp_(-0.05, 0.05)
    return diff(pm(x), ref(x))


def e_div_norm(pm, ref, x):
    for m in (pm, ref):
        with torch.no_grad():
            for p in m.parameters():
                if p.dim() == 2:
                    p.div_(p.norm())
    return diff(pm(x), ref(x))


def e_renorm_rows(pm, ref, x):  # max-norm constraint per output row (reads a whole row)
    for m in (pm, ref):
        with torch.no_grad():
            for p in m.parameters():
                if p.dim() == 2:
                    p.copy_(torch.renorm(p, 2, 0, 0.1))
    return diff(pm(x), ref(x))


def e_forward_hook_pm(pm, ref, x):
    seen = []
    for m in (pm, ref):
        m.register_forward_hook(lambda mod, i, o: seen.append(o.detach().clone()))
        m(x)
    return diff(seen[0], seen[1])


def e_backward_hook_pm(pm, ref, x):
    seen = []
    for m in (pm, ref):
        m.register_full_backward_hook(lambda mod, gi, go: seen.append(go[0].detach().clone()))
        m(x).pow(2).mean().backward()
    return diff(seen[0], seen[1])


def e_sub_hook(pm, ref, x):
    pm.blocks[0].register_forward_hook(lambda *a: None)
    return "registered"


def e_param_to_vector(pm, ref, x):
    v = torch.nn.utils.parameters_to_vector(pm.parameters())
    w = torch.nn.utils.parameters_to_vector(ref.parameters())
    return (v.numel(), w.numel())


def e_buffer_none(pm, ref, x):
    return sorted(k for k, _ in pm.named_buffers())


EXPERIMENTS = {k[2:]: v for k, v in dict(globals()).items() if k.startswith("e_")}


def body(rank, world, specs, names):
    warnings.simplefilter("ignore")
    out = {}
    for sname, spec in specs.items():
        for ename in names:
            model, x = build()
            ref = copy.deepcopy(model)
            try:
                pm = make_pm(model, x, spec)
                out[(sname, ename)] = ("ok", EXPERIMENTS[ename](pm, ref, x))
            except Exception as e:
                out[(sname, ename)] = ("raise", f"{type(e).__module__}.{type(e).__name__}: {str(e)[:300]}",
                                       traceback.format_exc()[-1500:])
            dist.barrier()
    return out


def spec_for(mesh, roles):
    model, x = build()
    with contextlib.redirect_stdout(io.StringIO()):
        return spec_from_plan(parallelizer.plan(parallelizer.trace(model, (x,)), mesh, axis_roles=roles))


def _main():
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    names = sys.argv[2].split(",") if len(sys.argv) > 2 else list(EXPERIMENTS)
    if world == 2:
        specs = {"ddp": spec_for({"dp": 2}, {"dp": "ddp"}), "fsdp": spec_for({"dp": 2}, {"dp": "fsdp"}),
                 "tp": spec_for({"tp": 2}, {"tp": "tp"})}
    else:
        specs = {"fsdp+tp": spec_for({"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"})}
    res = spawn(body, world, specs, names, timeout_s=900)
    for key in res[0]:
        vals = [r[key] for r in res]
        print(key, vals[0][:2] if all(v[:2] == vals[0][:2] for v in vals) else [v[:2] for v in vals])
    if "-v" in sys.argv:
        for key, v in res[0].items():
            if v[0] == "raise":
                print("=====", key); print(v[2])


def e_full_model_orthogonal(pm, ref, x):
    torch.manual_seed(5)
    with pm.full_model() as m:
        for p in m.parameters():
            if p.dim() >= 2: nn.init.orthogonal_(p)
    torch.manual_seed(5)
    for p in ref.parameters():
        if p.dim() >= 2: nn.init.orthogonal_(p)
    return max(diff(pm(x), ref(x)), params_diff(pm, ref))


def e_full_model_div_norm(pm, ref, x):
    with pm.full_model() as m:
        with torch.no_grad():
            for p in m.parameters():
                if p.dim() == 2: p.div_(p.norm())
    with torch.no_grad():
        for p in ref.parameters():
            if p.dim() == 2: p.div_(p.norm())
    return max(diff(pm(x), ref(x)), params_diff(pm, ref))


def e_apply_xavier_seeded(pm, ref, x):
    def init(m):
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight); nn.init.normal_(m.bias)
    for m in (pm, ref):
        torch.manual_seed(3); m.apply(init)
    a = pm(x); b = ref(x)
    a.pow(2).mean().backward(); b.pow(2).mean().backward()
    return max(diff(a, b), params_diff(pm, ref), grads_diff(pm, ref))


def e_apply_unseeded(pm, ref, x):
    torch.manual_seed(dist.get_rank())
    pm.apply(lambda m: nn.init.normal_(m.weight) if isinstance(m, nn.Linear) else None)


def e_apply_freeze_by_type(pm, ref, x):
    def freeze(m):
        if isinstance(m, nn.Linear) and m.out_features == 4:
            m.requires_grad_(False)
    for m in (pm, ref):
        m.apply(freeze)
        m(x).pow(2).mean().backward()
    return grads_diff(pm, ref)


def e_apply_change_attr(pm, ref, x):
    pm.apply(lambda m: setattr(m, "in_features", 3) if isinstance(m, nn.Linear) else None)


def e_meta_to_empty_apply(pm, ref, x):
    model = zoo.mlp(device="meta", **{k: v for k, v in SIZES.items() if k != "batch"})[0]
    pm = make_pm(model, x, pm.spec)
    pm.to_empty(device="cpu")
    def init(m):
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight); nn.init.zeros_(m.bias)
    for m in (pm, ref):
        torch.manual_seed(7); m.apply(init)
    return max(diff(pm(x), ref(x)), params_diff(pm, ref))


def e_maml(pm, ref, x):
    from torch.func import functional_call
    for m in (pm, ref):
        names, params = zip(*m.named_parameters())
        g = torch.autograd.grad(m(x).pow(2).mean(), params, create_graph=False)
        fast = {n: p - 0.1 * gi for n, p, gi in zip(names, params, g)}
        functional_call(m, fast, (x.flip(0),)).pow(2).mean().backward()
    return grads_diff(pm, ref)


def e_functional_call_full(pm, ref, x):
    from torch.func import functional_call
    return functional_call(pm, dict(ref.named_parameters()), (x,)).shape


def e_sub_apply(pm, ref, x):
    pm.blocks[0].apply(lambda m: None)


EXPERIMENTS.update({k[2:]: v for k, v in dict(globals()).items() if k.startswith("e_") and k[2:] not in EXPERIMENTS})

if __name__ == "__main__":
    _main()
