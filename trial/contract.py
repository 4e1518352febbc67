"""nn.Module contract on ParallelModule (ddp, fsdp, tp on 2 ranks) vs eager: LoRA-style frozen base, two param
groups, LambdaLR, gradient accumulation over 2 backward calls, clip_grad_norm_ (pm's and torch's), zero_grad(
set_to_none=False), backward hook on pm, state_dict save/load round trip.  Run: python trial/contract.py"""
import contextlib, copy, io, sys, warnings
warnings.filterwarnings("ignore")
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import parallelizer
from parallelizer.rewriter.spec import all_axis_groups, spec_from_plan
from parallelizer.runtime import create_groups
from parallelizer.runtime.launch import spawn
from parallelizer.runtime.module import ParallelModule


class Lora(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 32)
        self.base = nn.Linear(32, 64)
        self.lora_a = nn.Linear(32, 4, bias=False)
        self.lora_b = nn.Linear(4, 64, bias=False)
        self.ln = nn.LayerNorm(64)
        self.head = nn.Linear(64, 10)
        for p in (self.emb.weight, self.base.weight, self.base.bias):
            p.requires_grad_(False)

    def forward(self, ids, y):
        h = self.emb(ids)
        h = self.base(h) + self.lora_b(self.lora_a(h)) * 2.0
        logits = self.head(F.gelu(self.ln(h))).mean(1)
        return F.cross_entropy(logits, y)


def build(seed=0):
    torch.manual_seed(seed)
    m = Lora()
    nn.init.normal_(m.lora_b.weight, std=0.1)
    g = torch.Generator().manual_seed(5)
    return m, (torch.randint(0, 50, (4, 6), generator=g), torch.randint(0, 10, (4,), generator=g))


def batches(k):
    g = torch.Generator().manual_seed(100 + k)
    return torch.randint(0, 50, (4, 6), generator=g), torch.randint(0, 10, (4,), generator=g)


def groups(m):
    named = [(n, p) for n, p in m.named_parameters() if p.requires_grad]
    return [{"params": [p for n, p in named if n.endswith("weight") and "ln" not in n], "lr": 1e-2, "weight_decay": 0.1},
            {"params": [p for n, p in named if not (n.endswith("weight") and "ln" not in n)], "lr": 3e-2, "weight_decay": 0.0}]


def body(rank, ws, specs, torch_clip):
    out = {}
    for name, spec in specs.items():
        model, inputs = build()
        ref = copy.deepcopy(model)
        create_groups(all_axis_groups(spec.mesh))
        pm = ParallelModule(parallelizer.trace(model, inputs), spec, rank, model)
        calls = {"pm": 0, "ref": 0}
        pm.register_full_backward_hook(lambda mod, gi, go: calls.__setitem__("pm", calls["pm"] + 1))
        ref.register_full_backward_hook(lambda mod, gi, go: calls.__setitem__("ref", calls["ref"] + 1))
        opts = [torch.optim.AdamW(groups(m), eps=1e-3) for m in (pm, ref)]
        scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: 0.5 ** s) for o in opts]
        norms = []
        for step in range(3):
            for m in (pm, ref):
                for k in range(2):  # accumulation
                    ids, y = batches(step * 2 + k)
                    (m(ids, y) * 50).backward()
            if torch_clip:
                tn = torch.nn.utils.clip_grad_norm_(pm.parameters(), 0.5)
            else:
                tn = pm.clip_grad_norm_(0.5)
            rn = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
            norms.append((float(tn), float(rn)))
            for o, s in zip(opts, scheds):
                o.step(); s.step(); o.zero_grad(set_to_none=False)
        full = pm.full_state_dict()
        rsd = ref.state_dict()
        out[name] = {"norms": norms, "hook_calls": dict(calls),
                     "param_diff": max((full[k] - rsd[k]).abs().max().item() for k in rsd),
                     "worst": max(rsd, key=lambda k: (full[k] - rsd[k]).abs().max().item()),
                     "keys_equal": sorted(full) == sorted(rsd)}
        # state_dict round trip: save local shards, load into a fresh pm built from another seed
        buf = io.BytesIO(); torch.save(pm.state_dict(), buf); buf.seek(0)
        m2, _ = build(seed=7)
        pm2 = ParallelModule(parallelizer.trace(m2, inputs), spec, rank, m2)
        res = pm2.load_state_dict(torch.load(buf))
        full2 = pm2.full_state_dict()
        out[name]["roundtrip_diff"] = max((full2[k] - rsd[k]).abs().max().item() for k in rsd)
        out[name]["roundtrip_res"] = str(res)
        ids, y = batches(99)
        pm.eval(); ref.eval()
        out[name]["eval_loss"] = (pm(ids, y).item(), ref(ids, y).item())
    return out


if __name__ == "__main__":
    torch_clip = "--torch-clip" in sys.argv
    specs = {}
    model, inputs = build()
    for mesh, roles in (({"dp": 2}, {"dp": "ddp"}), ({"dp": 2}, {"dp": "fsdp"}), ({"tp": 2}, {"tp": "tp"})):
        with contextlib.redirect_stdout(io.StringIO()):
            plan = parallelizer.plan(parallelizer.trace(model, inputs), mesh, axis_roles=roles)
        specs[list(roles.values())[0]] = spec_from_plan(plan)
    res = spawn(body, 2, specs, torch_clip, timeout_s=600)
    for name in specs:
        for r in range(2):
            print(name, "rank", r, res[r][name])
