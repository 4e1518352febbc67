"""Finding (typed error, fixed in 2ade058): `loss += aux` (written in place) on a mean cross-entropy under
{"dp": 2} ddp was InfeasiblePlanError on cross_entropy_loss (Mixtral / Qwen2-MoE with output_router_logits).
Run: python trial/inplace_loss_add.py inplace_add inplace_add_const full_out"""
import contextlib, io, sys, warnings
warnings.filterwarnings("ignore")
import torch, torch.nn.functional as F
from torch import nn
import parallelizer

class M(nn.Module):
    def __init__(s, variant):
        super().__init__(); s.v = variant
        s.emb = nn.Embedding(32, 16); s.router = nn.Linear(16, 4, bias=False); s.head = nn.Linear(16, 32)
    def forward(s, ids, y):
        h = s.emb(ids)
        g = s.router(h).view(-1, 4)
        ce = F.cross_entropy(s.head(h).view(-1, 32), y.view(-1))
        if s.v.startswith("cat"):
            g = torch.cat([g, s.router(h * 2).view(-1, 4)], 0)
            if s.v == "cat_mean":
                return ce + g.softmax(-1).mean(0).pow(2).sum()
            s.v = "full"
        w = g.softmax(-1)
        if s.v == "ce_only":
            return ce
        _, sel = torch.topk(w, 2, dim=-1)
        if s.v == "topk":
            return ce + sel.float().sum() * 0 + w.mean()
        mask = F.one_hot(sel, 4)
        if s.v == "onehot":
            return ce + mask.float().mean()
        tpe = mask.float().mean(0)
        ppe = w.mean(0)
        if s.v == "sum_of_means":
            return ce + tpe.sum() + ppe.sum()
        aux = torch.sum(tpe * ppe.unsqueeze(0)) * 4
        if s.v == "full_out":
            return ce + aux, g, aux
        if s.v == "inplace_add":
            loss = ce
            loss += 0.1 * aux
            return loss
        if s.v == "inplace_add_const":
            loss = ce
            loss += 0.1
            return loss
        if s.v == "aux_first":
            return aux + ce
        if s.v == "ce_plus_aux_coef":
            return ce + 0.1 * aux.to(ce.device)
        return ce + aux

for v in sys.argv[1:]:
    torch.manual_seed(0)
    m = M(v); ids = torch.randint(0, 32, (4, 8)); y = torch.randint(0, 32, (4, 8))
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            p = parallelizer.plan(parallelizer.trace(m, (ids, y)), {"dp": 2}, axis_roles={"dp": "ddp"})
        print(v, "ok", [f.node for f in p.fallbacks])
    except Exception as e:
        print(v, type(e).__name__, str(e)[:200])
