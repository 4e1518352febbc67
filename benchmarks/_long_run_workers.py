"""Models, data, the training recipe and the rank body of `bench_long_runs` (importable by name in spawned
ranks). One recipe for every run, as real training scripts write it: AdamW (weight decay 0.1 on matrices, none on
biases / norms / 1-D tensors), linear warm-up then cosine decay of the learning rate (a LambdaLR stepped once per
optimizer step), `clip_grad_norm_(1.0)` on every step, gradient accumulation of 2 (each half batch's loss / 2),
label smoothing 0.1 where the task is a classification."""
from __future__ import annotations

import contextlib
import io
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, SEQ, VOCAB, ACCUM = 8, 16, 128, 2
LR, WD, WARMUP_FRACTION, CLIP = 3e-3, 0.1, 0.1, 1.0
EVAL_EVERY = 20  # a validation loss (eval mode, no_grad, a held-out batch) after every 20th optimizer step


# ------------------------------------------------------------------------------------------------ models


class MoE(nn.Module):
    """A char-level language model whose feed-forward blocks are top-2 mixtures of 4 experts (dense einsum
    dispatch) with the Switch Transformer's load-balancing loss (Fedus et al. 2021, eq. 4: E * sum_i f_i P_i,
    f_i the fraction of tokens whose first choice is expert i, P_i the mean router probability); returns
    (logits (B, T, V), aux loss)."""

    def __init__(self, vocab: int = VOCAB, dim: int = 32, hidden: int = 48, experts: int = 4, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(layers))
        self.routers = nn.ModuleList(nn.Linear(dim, experts, bias=False) for _ in range(layers))
        self.w_in = nn.ParameterList(nn.Parameter(torch.randn(experts, dim, hidden) * dim ** -0.5) for _ in range(layers))
        self.w_out = nn.ParameterList(nn.Parameter(torch.randn(experts, hidden, dim) * hidden ** -0.5) for _ in range(layers))
        self.final = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.experts = experts

    def forward(self, ids):
        x = self.embed(ids)  # (B, T, D)
        aux = x.new_zeros(())
        for norm, router, w_in, w_out in zip(self.norms, self.routers, self.w_in, self.w_out):
            h = norm(x)
            probs = router(h).softmax(-1)  # (B, T, E)
            top, idx = probs.topk(2, dim=-1)
            gates = torch.zeros_like(probs).scatter(-1, idx, top / top.sum(-1, keepdim=True))
            inner = F.gelu(torch.einsum("btd,edh->bteh", h, w_in))
            x = x + torch.einsum("bte,bteh,ehd->btd", gates, inner, w_out)
            first = F.one_hot(idx[..., 0], self.experts).to(probs.dtype)
            aux = aux + self.experts * (first.mean((0, 1)) * probs.mean((0, 1))).sum()
        return self.head(self.final(x)), aux


class ConvBN(nn.Module):
    """Conv -> BatchNorm2d -> ReLU twice, global average pool, a linear classifier (10 classes)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.body(x))


def vocab(name: str) -> int:
    return 101 if name == "gpt2odd" else VOCAB


def build(name: str) -> nn.Module:
    """The model `name` with the same random weights in every process (seed 0)."""
    torch.manual_seed(0)
    if name == "gpt2":  # tied wte / lm_head, LayerNorm, learned positions
        from parallelizer import zoo
        return zoo.gpt2(batch=BATCH // ACCUM, seq_len=SEQ, n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB)[0]
    if name == "gpt2drop":  # GPT-2's default dropout 0.1 (residual, embedding, attention)
        from parallelizer import zoo
        return zoo.gpt2(batch=BATCH // ACCUM, seq_len=SEQ, n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB,
                        dropout=0.1)[0]
    if name == "gpt2odd":  # sizes that shard unevenly: vocab 101, width 36 (fsdp dp=4: 9 rows; dp=3: 12)
        from parallelizer import zoo
        return zoo.gpt2(batch=BATCH // ACCUM, seq_len=SEQ, n_layer=2, n_embd=36, n_head=4, vocab_size=101)[0]
    if name == "llama":  # RMSNorm, rotary, grouped-query attention, untied head
        from parallelizer import zoo
        return zoo.llama(batch=BATCH // ACCUM, seq_len=SEQ, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=VOCAB)[0]
    if name == "vit":
        from transformers import ViTConfig, ViTForImageClassification
        cfg = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                        image_size=16, patch_size=4, num_channels=3, num_labels=10, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, attn_implementation="eager")
        return ViTForImageClassification(cfg)
    if name == "cnn":
        return ConvBN()
    if name == "moe":
        return MoE()
    raise KeyError(name)


# -------------------------------------------------------------------------------------------------- data


def _text() -> torch.Tensor:
    """Byte codes of the standard library's top-level *.py files, first 300 kB (`bench_convergence`'s corpus)."""
    from benchmarks._convergence_workers import corpus_tokens
    return corpus_tokens(300_000)


def batch(name: str, step: int, half: int, _cache={}) -> tuple[torch.Tensor, torch.Tensor]:
    """Half batch `half` (0 or 1) of step `step`: the same tensors in every process (a generator per call)."""
    g = torch.Generator().manual_seed(1000 * step + half)
    b = BATCH // ACCUM
    if name in ("gpt2", "gpt2drop", "gpt2odd", "llama", "moe"):
        if "text" not in _cache:
            _cache["text"] = _text()
        text = _cache["text"] % vocab(name)
        start = torch.randint(0, text.numel() - SEQ - 1, (b,), generator=g)
        window = torch.stack([text[s:s + SEQ + 1] for s in start.tolist()])
        return window[:, :-1], window[:, 1:]
    side = 16
    images = torch.randn(b, 3, side, side, generator=g)
    teacher = torch.randn(3 * side * side, 10, generator=torch.Generator().manual_seed(7))
    labels = (images.flatten(1) @ teacher).argmax(-1)  # a fixed random teacher: a learnable task
    return images, labels


def loss_fn(name: str):
    """The user's loss of model `name` (output, target) -> mean loss of the batch it is given."""
    def lm(out, y):
        logits = out.logits if hasattr(out, "logits") else out[0]
        smoothing = 0.0 if name == "llama" else 0.1
        ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), label_smoothing=smoothing)
        return ce + 0.01 * out[1] if name == "moe" else ce

    def cls(out, y):
        logits = out.logits if hasattr(out, "logits") else out
        return F.cross_entropy(logits, y, label_smoothing=0.1)
    return lm if name in ("gpt2", "gpt2drop", "gpt2odd", "llama", "moe") else cls


# ------------------------------------------------------------------------------------------------ recipe


def param_groups(named) -> list[dict]:
    """AdamW groups: weight decay on tensors of 2+ dims except norms, none on biases, norm weights, 1-D."""
    decay, no_decay = [], []
    for name, p in named:
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "norm" in name.lower() or name.endswith("bias") else decay).append(p)
    return [{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}]


def lr_lambda(steps: int):
    warmup = max(1, int(steps * WARMUP_FRACTION))

    def f(i):
        if i < warmup:
            return (i + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (i - warmup) / max(1, steps - warmup)))
    return f


def make_optimizer(named, steps: int, zero1_group=None):
    groups = param_groups(named)
    if zero1_group is not None:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, process_group=zero1_group, lr=LR)
    else:
        opt = torch.optim.AdamW(groups, lr=LR)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(steps))


def _cast(t: torch.Tensor, dtype) -> torch.Tensor:
    return t.to(dtype) if t.is_floating_point() else t


def train_loop(name: str, forward_backward, clip, opt, sched, start: int, stop: int, dtype=torch.float32,
               evaluate=None, before_step=None) -> dict:
    """Steps [start, stop): per step ACCUM half batches through `forward_backward(x, y, scale)` (returns the
    half's loss before scaling), `clip()` (returns the total norm before clipping), opt.step, sched.step; after
    every EVAL_EVERY-th step `evaluate(x, y)` on a held-out batch (None: not evaluated); `before_step(step)`
    first, if given.
    Returns {"loss": [...], "norm": [...], "lr": [...], "eval": [float or None per step]}."""
    out = {"loss": [], "norm": [], "lr": [], "eval": []}
    for step in range(start, stop):
        if before_step is not None:
            before_step(step)
        total = 0.0
        for half in range(ACCUM):
            x, y = batch(name, step, half)
            total += float(forward_backward(_cast(x, dtype), y, 1.0 / ACCUM)) / ACCUM
        out["norm"].append(float(clip()))
        out["lr"].append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        opt.zero_grad()
        out["loss"].append(total)
        held_out = batch(name, 10 ** 6, 0)
        out["eval"].append(float(evaluate(_cast(held_out[0], dtype), held_out[1]))
                           if evaluate is not None and (step + 1) % EVAL_EVERY == 0 else None)
    return out


UNFROZEN_AT = 60  # "frozen" runs: the position embedding (wpe) is frozen until this step, as a fine-tuning
FROZEN = "transformer.wpe.weight"  # recipe that unfreezes layers after a warm-up does


def _freezer(named, frozen: bool):
    """`before_step` of a "frozen" run: requires_grad False on FROZEN before UNFROZEN_AT, True from it."""
    params = dict(named)

    def before_step(step):
        if frozen:
            params[FROZEN].requires_grad_(step >= UNFROZEN_AT)
    return before_step


def _autocast(bf16: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def eager_run(name: str, steps: int, dtype=torch.float32, bf16: bool = False, frozen: bool = False) -> dict:
    """One device: the recipe for `steps` steps in `dtype` (float64: the reference), optionally under bf16
    autocast; returns the curves and the final state dict (float64 copies)."""
    torch.set_num_threads(1)
    model = build(name).to(dtype)
    model.train()
    opt, sched = make_optimizer(model.named_parameters(), steps)
    lf = loss_fn(name)
    torch.manual_seed(1)  # the generator dropout draws from, as in `rank_run`

    def fb(x, y, scale):
        with _autocast(bf16):
            out = model(x)
        loss = lf(out, y)
        (loss * scale).backward()
        return loss.detach()
    curves = train_loop(name, fb, lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP), opt, sched,
                        0, steps, dtype, _evaluator(model, lf, bf16), _freezer(model.named_parameters(), frozen))
    curves["state"] = {k: v.detach().double().clone() for k, v in model.state_dict().items()}
    return curves


def _evaluator(module, lf, bf16: bool):
    """A validation pass as training scripts write it: eval(), no_grad, the loss, back to train()."""
    def evaluate(x, y):
        module.eval()
        with torch.no_grad():
            with _autocast(bf16):  # the forward under autocast, the loss outside, as in training
                out = module(x)
            loss = lf(out, y)
        module.train()
        return loss
    return evaluate


# -------------------------------------------------------------------------------------------------- ranks


def _parallelize(name: str, mesh: dict, options: dict):
    import parallelizer
    model = build(name)
    example = batch(name, 0, 0)[0]
    with contextlib.redirect_stdout(io.StringIO()):
        return parallelizer.auto_parallelize(model, (example,), mesh=mesh, **options)


def rank_run(rank: int, world_size: int, name: str, mesh: dict, options: dict, steps: int,
             bf16: bool = False, zero1: bool = False, span: tuple[int, int] | None = None,
             save_to: str | None = None, load_from: str | None = None, frozen: bool = False) -> dict:
    """The recipe on `auto_parallelize(build(name), mesh=mesh, **options)`: pipelines (a "pp" axis) through
    `pm.step(x, target=y, loss_fn=loss / ACCUM)`, other plans through `pm(x)` and `loss.backward()` as a user
    loop writes it; clipping by torch's `clip_grad_norm_(pm.parameters(), 1.0)`. `span`: the steps to run (a
    resume runs the second part of a `steps`-step schedule); `save_to` / `load_from`: a
    `parallelizer.checkpoint` directory (model + optimizer) and the LR scheduler's state beside it.
    Returns (rank 0) the curves and `pm.full_state_dict()`; seconds on every rank."""
    torch.set_num_threads(1)
    import torch.distributed as dist
    from parallelizer import checkpoint
    pm = _parallelize(name, mesh, options)
    pm.train()
    opt, sched = make_optimizer(pm.named_parameters(), steps, pm.process_group("dp") if zero1 else None)
    start, stop = span or (0, steps)
    if load_from is not None:
        checkpoint.load(pm, opt, load_from)
        sched.load_state_dict(torch.load(f"{load_from}/sched.pt"))
    lf = loss_fn(name)
    pipeline = "pp" in mesh
    torch.manual_seed(1 + start)  # the generator dropout draws from, as in `eager_run`

    def fb(x, y, scale):
        if pipeline:
            # label smoothing: the step cannot read the item count from the loss's graph (a StepError says
            # so); a mean over the targets counts them
            return pm.step(x, target=y, loss_fn=lambda out, t: lf(out, t) * scale,
                           item_count=lambda t: t.numel()) / scale
        with _autocast(bf16):
            out = pm(x)
        loss = lf(out, y)
        (loss * scale).backward()
        return loss.detach()
    t0 = time.perf_counter()
    curves = train_loop(name, fb, lambda: torch.nn.utils.clip_grad_norm_(pm.parameters(), CLIP), opt, sched,
                        start, stop, evaluate=None if pipeline else _evaluator(pm, lf, bf16),
                        before_step=_freezer(pm.named_parameters(), frozen))
    seconds = time.perf_counter() - t0
    if save_to is not None:
        checkpoint.save(pm, opt, save_to)
        if rank == 0:
            torch.save(sched.state_dict(), f"{save_to}/sched.pt")
        dist.barrier()
    state = {k: v.detach().double().clone() for k, v in pm.full_state_dict().items()}
    spread = replica_spread(pm)
    return {"seconds": seconds, **(dict(curves, state=state, replicas=spread) if rank == 0 else {})}


def replica_spread(pm) -> dict:
    """Collective. Ranks (and pipeline stages: a tied embedding's copies) that hold the same piece of a parameter
    or buffer must hold the same values after any number of steps; returns the largest difference between such
    copies ("spread", 0.0 when bitwise equal), its tensor, how many tensors were compared across ranks, and
    whether torch's default generator state is the same on the ranks that run the same program (dropout draws
    from it)."""
    import torch.distributed as dist
    from parallelizer.runtime.shard_origin import module_pieces
    mine = []
    for stage in (list(pm.stages) if hasattr(pm, "stages") else [pm]):
        pieces = module_pieces(stage)
        for fqn, t in [*stage.named_parameters(), *stage.named_buffers()]:
            fqn = fqn.split("stages.", 1)[-1].split(".", 1)[-1] if fqn.startswith("stages.") else fqn
            if fqn in pieces:
                mine.append((fqn, pieces[fqn], t.detach().clone()))
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (mine, torch.get_rng_state()))
    seen, worst, compared = {}, (0.0, None), set()
    for held, _ in everyone:
        for fqn, piece, t in held:
            key = (fqn, tuple(map(tuple, piece[1:])) if piece else None, piece[0] if piece else None)
            if key in seen:
                compared.add(fqn)
                d = (t.double() - seen[key].double()).abs().max().item() if t.numel() else 0.0
                if d > worst[0] or worst[1] is None:
                    worst = (max(worst[0], d), fqn if d >= worst[0] else worst[1])
            else:
                seen[key] = t
    rng = {}  # ranks holding the same tensors (a pipeline: the same stages) run the same program and draws
    for held, state in everyone:
        rng.setdefault(frozenset(fqn for fqn, _, _ in held), []).append(state)
    return {"spread": worst[0], "tensor": worst[1], "compared": len(compared),
            "rng_equal": all(torch.equal(group[0], r) for group in rng.values() for r in group)}
