"""trial6a harness: pm.step user loops on pipeline and mixed meshes vs one device (whole batch).
Run: python -m trial.h6a GROUP"""
from __future__ import annotations

import contextlib, copy, io, sys, os, traceback, math
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "distributed"))
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist

import parallelizer
from parallelizer import zoo

V, D, B, T = 100, 32, 8, 8


class MLPBlock(nn.Module):
    def __init__(self, kind="mlp", p=0.0):
        super().__init__()
        self.kind, self.p = kind, p
        self.ln = nn.LayerNorm(D)
        self.fc1, self.fc2 = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)
        if kind == "bn":
            self.bn = nn.BatchNorm1d(D)
        if kind == "ema":
            self.register_buffer("ema", torch.zeros(D))
        if kind == "attn":
            self.qkv, self.o = nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x, mask=None):
        if self.kind == "attn":
            h = self.ln(x)
            q, k, v = self.qkv(h).view(x.shape[0], x.shape[1], 3, 4, D // 4).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.p if self.training else 0.0)
            x = x + self.o(a.transpose(1, 2).reshape(x.shape))
            return x + self.fc2(F.gelu(self.fc1(x)))
        h = self.fc2(F.gelu(self.fc1(self.ln(x))))
        if self.kind == "bn":
            h = self.bn(h.transpose(1, 2)).transpose(1, 2)
        if self.kind == "ema":
            with torch.no_grad():
                self.ema.mul_(0.9).add_(0.1 * h.mean((0, 1)))
        if self.p:
            h = F.dropout(h, self.p, self.training)
        return x + h


class Stack(nn.Module):
    def __init__(self, kind="mlp", n=4, tied=False, p=0.0, masked=False):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.blocks = nn.ModuleList(MLPBlock(kind, p) for _ in range(n))
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)
        if tied:
            self.head.weight = self.emb.weight
        self.masked = masked

    def forward(self, ids, pad=None):
        x = self.emb(ids)
        mask = None
        if pad is not None:  # (B, T) bool keep -> (B, 1, T, T) attention mask, causal
            causal = torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool, device=ids.device).tril()
            mask = pad[:, None, None, :] & causal
        for b in self.blocks:
            x = b(x, mask) if mask is not None else b(x)
        return self.head(self.norm(x))


def ce(out, y):  # noqa
    logits = out.logits if hasattr(out, "logits") else out
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


def labels_of(ids, uneven=True):
    y = torch.roll(ids, -1, 1)
    y[:, -1] = -100
    if uneven:
        y[0, 1:] = -100
        y[3, 3:] = -100
        y[6, :] = -100
    return y


def build(spec):
    torch.manual_seed(0)
    kind = spec.get("model", "stack")
    g = torch.Generator().manual_seed(1)
    if kind == "stack":
        m = Stack(spec.get("block", "mlp"), spec.get("n", 4), spec.get("tied", False), spec.get("p", 0.0))
        ids = torch.randint(0, V, (B, T), generator=g)
        args = (ids,)
        if spec.get("pad"):
            pad = torch.ones(B, T, dtype=torch.bool)
            pad[1, 5:] = False
            pad[4, 2:] = False
            args = (ids, pad)
        return m, args, {}
    if kind.startswith("own_"):
        m = OwnNormStack(kind[4:])
        return m, (torch.randint(0, V, (B, T), generator=g),), {}
    if kind == "gpt2":
        m, (ids,) = zoo.gpt2(n_layer=4, n_embd=32, n_head=4, vocab_size=128, batch=B, seq_len=T,
                             dropout=spec.get("p", 0.0))
        return m, (ids,), {}
    if kind == "llama":
        m, (ids,) = zoo.llama(num_hidden_layers=4, hidden_size=32, intermediate_size=64, vocab_size=128,
                              batch=B, seq_len=T, dropout=spec.get("p", 0.0))
        return m, (ids,), {}
    if kind == "bert":
        from transformers import BertConfig, BertForMaskedLM
        cfg = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=spec.get("p", 0.0),
                         attention_probs_dropout_prob=spec.get("p", 0.0), attn_implementation="eager")
        m = BertForMaskedLM(cfg)
        ids = torch.randint(0, 128, (B, T), generator=g)
        return m, (ids,), {}
    raise ValueError(kind)


def coords(rank, mesh):
    out, r = {}, rank
    for ax, n in reversed(list(mesh.items())):
        out[ax] = r % n
        r //= n
    return out


def _diff(pm, ref, grads):
    from step_workers import _diff as d
    return d(pm, ref, grads)


def case(rank, world, spec):
    res = {"name": spec["name"]}
    try:
        res.update(_case(rank, world, spec))
    except Exception as e:  # noqa
        res["error"] = f"{type(e).__module__}.{type(e).__name__}: {str(e)[:600]}"
        res["tb"] = traceback.format_exc()[-1500:]
    return res


def _case(rank, world, spec):
    model, args, kwargs = build(spec)
    for fq in spec.get("freeze", []):
        for n, p in model.named_parameters():
            if n.startswith(fq):
                p.requires_grad_(False)
    ref = copy.deepcopy(model)
    ids = args[0]
    labels = labels_of(ids, spec.get("uneven", True))
    opts = dict(spec.get("opts", {}))
    if spec.get("own"):
        opts["example_kwargs"] = {"labels": labels}
    with contextlib.redirect_stdout(io.StringIO()):
        pm = parallelizer.auto_parallelize(model, args, mesh=spec["mesh"], **opts)
    out = {"kind": type(pm).__name__}
    if pm.plan.pipeline is not None:
        out["sched"] = pm.plan.pipeline.schedule if hasattr(pm.plan.pipeline, "schedule") else "?"
    lr = spec.get("lr", 0.05)
    optname = spec.get("optim", "sgd")

    def mkopt(m):
        ps = [p for p in m.parameters() if p.requires_grad]
        if spec.get("groups"):
            named = [(n, p) for n, p in m.named_parameters() if p.requires_grad]
            dec = [p for n, p in named if p.dim() >= 2]
            nod = [p for n, p in named if p.dim() < 2]
            groups = [{"params": dec, "weight_decay": 0.1}, {"params": nod, "weight_decay": 0.0, "lr": lr * 3}]
        else:
            groups = [{"params": ps}]
        if optname == "sgd":
            return torch.optim.SGD(groups, lr=lr, momentum=0.9)
        return torch.optim.AdamW(groups, lr=1e-2, eps=1e-3)
    opt, ropt = mkopt(pm), mkopt(ref)
    sch = rsch = None
    if spec.get("sched"):
        sch = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
        rsch = torch.optim.lr_scheduler.LambdaLR(ropt, lambda s: 1.0 / (1 + s))
    own = spec.get("own", False)
    accum = spec.get("accum", 1)
    worst = {"loss": 0.0, "grad": 0.0, "norm": 0.0}
    for step in range(spec.get("steps", 3)):
        for a in range(accum):
            if own:
                loss = pm.step(*args, labels=labels, **kwargs)
                rl = ref(*args, labels=labels, **kwargs)
                rl = rl.loss if hasattr(rl, "loss") else rl
            else:
                lf = globals()[spec.get("loss", "ce")]
                extra = {"item_count": spec["item_count"]} if "item_count" in spec else {}
                loss = pm.step(*args, target=labels, loss_fn=lf, **extra, **kwargs)
                rl = lf(ref(*args, **kwargs), labels)
            rl.backward()
            worst["loss"] = max(worst["loss"], abs(loss.item() - rl.item()))
        worst["grad"] = max(worst["grad"], _diff(pm, ref, True))
        if spec.get("clip"):
            t = pm.clip_grad_norm_(spec["clip"])
            rt = torch.nn.utils.clip_grad_norm_(ref.parameters(), spec["clip"])
            worst["norm"] = max(worst["norm"], abs(t.item() - rt.item()))
        opt.step(); ropt.step(); opt.zero_grad(); ropt.zero_grad()
        if sch:
            sch.step(); rsch.step()
    worst["params"] = _diff(pm, ref, False)
    full = pm.full_state_dict()
    rsd = ref.state_dict()
    worst["sd_keys"] = sorted(full) == sorted(rsd)
    worst["sd"] = max(((full[k].float() - rsd[k].float()).abs().max().item() for k in rsd if k in full), default=-1)
    # replica spread over dp
    local = {k: v.detach().clone() for k, v in pm.state_dict().items()}
    allsd = [None] * world
    dist.all_gather_object(allsd, local)
    mesh = pm.plan.pipeline.mesh if pm.plan.pipeline is not None else spec["mesh"]
    mesh = dict(mesh) if isinstance(mesh, dict) else {a: s for a, s in zip(mesh.axes, mesh.shape)} if hasattr(mesh, "axes") else spec["mesh"]
    spread = 0.0
    if "dp" in mesh:
        me = coords(rank, mesh)
        for r in range(world):
            c = coords(r, mesh)
            if r != rank and all(c[a] == me[a] for a in mesh if a != "dp"):
                for k, v in local.items():
                    if k in allsd[r] and allsd[r][k].shape == v.shape:
                        spread = max(spread, (allsd[r][k].float() - v.float()).abs().max().item())
    worst["replica_spread"] = spread
    out.update(worst)
    return out


def run_all(rank, world, specs):
    outs = []
    for s in specs:
        outs.append(case(rank, world, s))
        dist.barrier()
    return outs


def report(specs, world=4, timeout=900):
    from parallelizer.runtime import spawn
    per_rank = spawn(run_all, world, specs, timeout_s=timeout)
    for i, s in enumerate(specs):
        rs = [pr[i] for pr in per_rank]
        errs = {r.get("error") for r in rs if "error" in r}
        if errs:
            print(f"{s['name']}: ERROR {errs}")
            print(rs[0].get("tb", "") if "error" in rs[0] else [r for r in rs if "error" in r][0]["tb"])
            continue
        keys = ("loss", "grad", "norm", "params", "sd", "replica_spread")
        w = {k: max(r[k] for r in rs) for k in keys}
        flag = "MISMATCH" if max(w["loss"], w["grad"], w["params"], w["sd"]) > 1e-4 else "ok"
        print(f"{s['name']}: {flag} {rs[0]['kind']} {rs[0].get('sched','')} " +
              " ".join(f"{k}={v:.2e}" for k, v in w.items()) + f" keys={all(r['sd_keys'] for r in rs)}")
    sys.stdout.flush()
    return per_rank


def _lg(out):
    return out.logits if hasattr(out, "logits") else out


def ce_smooth(out, y):
    return F.cross_entropy(_lg(out).flatten(0, 1), y.flatten(), label_smoothing=0.1)


def ce_sum(out, y):
    return F.cross_entropy(_lg(out).flatten(0, 1), y.flatten(), reduction="sum")


def ce_ign0(out, y):
    return F.cross_entropy(_lg(out).flatten(0, 1), y.clamp(min=0).flatten(), ignore_index=0)


def ce_shift(out, y):
    return F.cross_entropy(_lg(out)[:, :-1].flatten(0, 1), y[:, 1:].flatten())


def nll(out, y):
    return F.nll_loss(F.log_softmax(_lg(out), -1).flatten(0, 1), y.flatten())


def ce_none_mean(out, y):
    return F.cross_entropy(_lg(out).flatten(0, 1), y.flatten(), reduction="none").mean()


def ce_masked(out, y):
    per = F.cross_entropy(_lg(out).flatten(0, 1), y.flatten(), reduction="none")
    m = (y.flatten() != -100).float()
    return (per * m).sum() / m.sum()


def ce_per_sample(out, y):
    per = F.cross_entropy(_lg(out).flatten(0, 1), y.flatten(), reduction="none").view(y.shape)
    return per.sum(1).mean()


def ce_times2(out, y):
    return 2.0 * F.cross_entropy(_lg(out).flatten(0, 1), y.flatten())


def ce_zloss(out, y):
    lg = _lg(out)
    return F.cross_entropy(lg.flatten(0, 1), y.flatten()) + 1e-2 * torch.logsumexp(lg, -1).pow(2).mean()


def ce_weighted(out, y):
    w = torch.linspace(0.5, 1.5, V)
    return F.cross_entropy(_lg(out).flatten(0, 1), y.flatten(), weight=w)


def ce_seqmean_first(out, y):  # mean over tokens per sample then mean over samples ("per-sample mean")
    per = F.cross_entropy(_lg(out).flatten(0, 1), y.flatten(), reduction="none").view(y.shape)
    cnt = (y != -100).sum(1).clamp(min=1)
    return (per.sum(1) / cnt).mean()


def ce_max(out, y):
    per = F.cross_entropy(_lg(out).flatten(0, 1), y.flatten(), reduction="none")
    return per.max()


def cli_stack(batch: int = 8, seq_len: int = 8, block: str = "attn", n: int = 4, tied: int = 1, device="cpu"):
    """CLI factory: the attention stack with a padding mask as a second input, loss computed inside (labels=)."""
    torch.manual_seed(0)
    with torch.device(device):
        m = OwnLossStack(block, n, bool(tied))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (batch, seq_len), generator=g)
    pad = torch.ones(batch, seq_len, dtype=torch.bool)
    pad[1 % batch, seq_len // 2:] = False
    y = labels_of(ids, True) if batch >= 8 else labels_of(ids, False)
    return m, (ids.to(device), pad.to(device)), {"labels": y.to(device)}


class OwnLossStack(Stack):
    def forward(self, ids, pad, labels):
        logits = super().forward(ids, pad)
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def cli_llama(batch: int = 8, seq_len: int = 8, device="cpu"):
    m, (ids,), kw = zoo.llama(num_hidden_layers=4, hidden_size=32, intermediate_size=64, vocab_size=128,
                              batch=batch, seq_len=seq_len, labels=True, device=device)
    return m, (ids,), kw


def ce_sum_div_numel(out, y):  # "sum then divide by the batch's element count": a mean written by hand
    return F.cross_entropy(_lg(out).flatten(0, 1), y.flatten(), reduction="sum") / y.numel()


def ce_sum_div_batch(out, y):  # "per-sample loss summed, divided by the batch size"
    return F.cross_entropy(_lg(out).flatten(0, 1), y.flatten(), reduction="sum") / y.shape[0]


def sq_sum_div_len(out, y):
    return _lg(out).pow(2).sum() / len(y)


def kl_mean0_sum(out, y):  # per-dim terms averaged over the batch, then summed over dims
    lp = F.log_softmax(_lg(out), -1)
    return (-(lp.gather(-1, y.clamp(min=0).unsqueeze(-1)).squeeze(-1))).mean(0).sum()


class OwnNormStack(Stack):
    """The model's own loss, normalised by the batch size (`kind` "div_batch") or a batch mean then sum."""

    def __init__(self, kind):
        super().__init__("mlp", 4)
        self.kind = kind

    def forward(self, ids, labels):
        lg = super().forward(ids)
        if self.kind == "div_batch":
            return F.cross_entropy(lg.flatten(0, 1), labels.flatten(), reduction="sum") / ids.shape[0]
        per = F.cross_entropy(lg.flatten(0, 1), labels.clamp(min=0).flatten(), reduction="none").view(labels.shape)
        return per.mean(0).sum()
