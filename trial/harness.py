"""Trial harness: a user loop (auto_parallelize + pm.step + AdamW) on a plan vs the single-device model."""
from __future__ import annotations
import contextlib, copy, io, os, sys, traceback
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "distributed"))
import torch
import torch.distributed as dist
import torch.nn.functional as F
import parallelizer
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.pipeline_rehearsal import stage_diffs
from parallelizer.runtime.rehearsal import _max_diff
from parallelizer.rewriter.state import shard_tensor
import transformers as T

B, S, V = 8, 16, 128
RATIO = False


def ids_labels(seed=1, vocab=V):
    ids = torch.randint(0, vocab, (B, S), generator=torch.Generator().manual_seed(seed))
    labels = ids.clone()
    labels[:3, 3:] = -100
    labels[5, 7:] = -100
    return ids, labels


def build(name):
    """-> model, args, kwargs (kwargs passed to the model's forward; labels inside)."""
    torch.manual_seed(0)
    ids, labels = ids_labels()
    if name == "bert_cls":
        cfg = T.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64,
                           max_position_embeddings=32, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        m = T.BertForSequenceClassification(cfg)
        am = torch.ones(B, S, dtype=torch.long); am[:3, 10:] = 0
        return m, (ids,), {"attention_mask": am, "labels": torch.arange(B) % 3}
    if name == "bert_reg":  # num_labels=1: MSE regression loss (own loss, "equal" weighting)
        cfg = T.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64,
                           max_position_embeddings=32, num_labels=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        return T.BertForSequenceClassification(cfg), (ids,), {"labels": torch.linspace(-1, 1, B)}
    if name == "roberta_cls":
        cfg = T.RobertaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64,
                              max_position_embeddings=40, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        m = T.RobertaForSequenceClassification(cfg)
        return m, (ids.clamp(min=3),), {"labels": torch.arange(B) % 3}
    if name == "llama_gqa_kw":
        cfg = T.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                            num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
        m = T.LlamaForCausalLM(cfg)
        am = torch.ones(B, S, dtype=torch.long); am[1, :4] = 0  # left padding
        pos = (am.cumsum(-1) - 1).clamp(min=0)
        return m, (ids,), {"attention_mask": am, "position_ids": pos, "labels": labels}
    if name == "mixtral_aux":
        cfg = T.MixtralConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                              num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
                              output_router_logits=True, router_aux_loss_coef=0.02)
        return T.MixtralForCausalLM(cfg), (ids,), {"labels": labels}
    if name == "mixtral":
        cfg = T.MixtralConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                              num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64)
        return T.MixtralForCausalLM(cfg), (ids,), {"labels": labels}
    if name == "qwen2moe":
        cfg = T.Qwen2MoeConfig(vocab_size=V, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
                               shared_expert_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
                               num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, max_position_embeddings=64)
        return T.Qwen2MoeForCausalLM(cfg), (ids,), {"labels": labels}
    if name == "qwen2moe_aux":
        cfg = T.Qwen2MoeConfig(vocab_size=V, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
                               shared_expert_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
                               num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
                               output_router_logits=True, router_aux_loss_coef=0.02)
        return T.Qwen2MoeForCausalLM(cfg), (ids,), {"labels": labels}
    if name == "gemma2":
        cfg = T.Gemma2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=8,
                             final_logit_softcapping=3.0, attn_logit_softcapping=5.0, attn_implementation="eager")
        return T.Gemma2ForCausalLM(cfg), (ids,), {"labels": labels}
    if name == "t5":
        cfg = T.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)
        return T.T5ForConditionalGeneration(cfg), (ids,), {"labels": labels.clamp(min=0)}
    if name == "bart":
        cfg = T.BartConfig(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                           decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=32,
                           dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
        return T.BartForConditionalGeneration(cfg), (ids,), {"labels": labels}
    if name.startswith("llama_ign"):  # llama_ign<a>_<b>: labels[a:b] all ignored
        a, b = map(int, name[len("llama_ign"):].split("_"))
        cfg = T.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                            num_key_value_heads=2, max_position_embeddings=64)
        labels[a:b] = -100
        return T.LlamaForCausalLM(cfg), (ids,), {"labels": labels}
    if name in ("llama_pos1", "llama_nitems", "llama_nitems_t"):
        cfg = T.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                            num_key_value_heads=2, max_position_embeddings=64)
        m = T.LlamaForCausalLM(cfg)
        if name == "llama_pos1":  # one row of positions broadcast over the batch (common HF usage)
            return m, (ids,), {"position_ids": torch.arange(S)[None], "labels": labels}
        n = int((labels[:, 1:] != -100).sum())
        return m, (ids,), {"labels": labels, "num_items_in_batch": n if name == "llama_nitems" else torch.tensor(n)}
    if name == "gpt2":
        from parallelizer import zoo
        m, (x,) = zoo.gpt2(n_layer=4, n_embd=32, n_head=4, vocab_size=V, batch=B, seq_len=S)
        return m, (x,), {}
    raise KeyError(name)


def diff(pm, reference, grads):
    spec = spec_from_plan(pm.plan)
    if pm.plan.pipeline is not None:
        d = stage_diffs(pm.run, reference, spec, None, grads=grads)
        return d[0] if not RATIO else d[2]
    ref = dict(reference.named_parameters())
    pick = (lambda p: p.grad if p.grad is not None else torch.zeros_like(p)) if grads else (lambda p: p)
    return _max_diff(((f, pick(p).detach(), shard_tensor(pick(ref[f]).detach(), spec.params[f], spec.mesh, pm.coords))
                      for f, p in pm.named_parameters()), None)[0 if not RATIO else 2]


def first(out):
    return out.loss if hasattr(out, "loss") else out[0] if isinstance(out, tuple) else out


def worker(rank, world, name, mesh, options, steps=2, loss_fn=None, target=None, step_kw=None, clip=None, sched=False):
    """Returns dict of worst diffs, or the error."""
    try:
        model, args, kwargs = build(name)
        reference = copy.deepcopy(model)
        with contextlib.redirect_stdout(io.StringIO()):
            pm = parallelizer.auto_parallelize(model, args, mesh=mesh, example_kwargs=kwargs or None, **options)
        opt = torch.optim.AdamW(pm.parameters(), lr=1e-2)
        ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
        scheds = [torch.optim.lr_scheduler.StepLR(o, 1, 0.5) for o in (opt, ref_opt)] if sched else []
        w = {"loss": 0.0, "grad": 0.0, "losses": []}
        for _ in range(steps):
            kw = dict(kwargs)
            if target is not None:
                loss = pm.step(*args, target=target, loss_fn=loss_fn, **(step_kw or {}), **kw)
                ref_loss = loss_fn(reference(*args, **kw), target) if loss_fn is not None else first(reference(*args, **kw))
            else:
                loss = pm.step(*args, loss_fn=loss_fn, **(step_kw or {}), **kw)
                ref_loss = first(reference(*args, **kw)) if loss_fn is None else loss_fn(reference(*args, **kw), None)
            ref_loss.backward()
            if clip:
                t1 = pm.clip_grad_norm_(clip); t2 = torch.nn.utils.clip_grad_norm_(reference.parameters(), clip)
                w["norm"] = max(w.get("norm", 0.0), abs(t1.item() - t2.item()))
            w["losses"].append((loss.item(), ref_loss.item()))
            w["loss"] = max(w["loss"], abs(loss.item() - ref_loss.item()))
            w["grad"] = max(w["grad"], diff(pm, reference, True))
            global RATIO
            RATIO = True
            w["grad_ratio"] = max(w.get("grad_ratio", 0.0), diff(pm, reference, True))
            RATIO = False
            if loss.isnan().item() != ref_loss.isnan().item():
                w["loss"] = float("inf")
            opt.step(); ref_opt.step(); opt.zero_grad(); ref_opt.zero_grad()
            for s in scheds:
                s.step()
        w["params"] = diff(pm, reference, False)
        if pm.plan.pipeline is not None:
            w["sched"] = pm.plan.pipeline.schedule
            w["mb"] = pm.plan.pipeline.microbatches
        return w
    except Exception as e:
        return {"error": f"{type(e).__module__}.{type(e).__name__}: {str(e)[:600]}", "tb": traceback.format_exc()[-1500:]}


def run(name, mesh, options=None, world=4, timeout=300, **kw):
    from parallelizer.runtime import spawn
    try:
        res = spawn(worker, world, name, mesh, options or {}, *[kw.get(k) for k in ()], timeout_s=timeout) if not kw else \
            spawn(_kwworker, world, name, mesh, options or {}, kw, timeout_s=timeout)
    except Exception as e:
        return f"SPAWN {type(e).__name__}: {str(e)[:1500]}"
    return res


def _kwworker(rank, world, name, mesh, options, kw):
    return worker(rank, world, name, mesh, options, **kw)


def summarize(tag, res):
    if isinstance(res, str):
        print(tag, res, flush=True); return
    errs = [r for r in res if "error" in r]
    if errs:
        print(tag, "ERROR", errs[0]["error"], "\n", errs[0]["tb"], flush=True); return
    worst = {k: max(r.get(k, 0.0) for r in res) for k in ("loss", "grad", "grad_ratio", "params", "norm")}
    print(tag, "sched", res[0].get("sched"), "mb", res[0].get("mb"), {k: f"{v:.2e}" for k, v in worst.items()},
          "losses(r0,last)", res[0]["losses"], res[-1]["losses"], flush=True)


if __name__ == "__main__":
    import json
    name, mesh = sys.argv[1], json.loads(sys.argv[2])
    options = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    world = 1
    for v in mesh.values():
        world *= v
    summarize(f"{name} {mesh} {options}", run(name, mesh, options, world=world))


def lm_loss(out, y):
    logits = out.logits if hasattr(out, "logits") else out[0] if isinstance(out, tuple) else out
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


def shifted_lm_loss(out, y):
    logits = out.logits if hasattr(out, "logits") else out
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), y[:, 1:].flatten())


def count_shifted(y):
    return (y[:, 1:] != -100).sum()


def count_valid(y):
    return (y != -100).sum()


def sq_mean(out, y):
    logits = out.logits if hasattr(out, "logits") else out
    return logits.float().pow(2).mean()


def per_sample_mean(out, y):  # mean over the batch of per-sample losses (y: float (B,))
    logits = out.logits if hasattr(out, "logits") else out
    return ((logits.float().mean(dim=(1, 2)) - y) ** 2).mean()


def make_target(kind):
    ids, labels = ids_labels()
    if kind == "labels":
        return labels
    if kind == "mb0_ignored":
        labels[:4] = -100; return labels
    if kind == "float":
        return torch.linspace(0, 1, B)
    raise KeyError(kind)


def tworker(rank, world, name, mesh, options, kw):
    kw = dict(kw)
    kw["target"] = make_target(kw.pop("target_kind"))
    kw["loss_fn"] = globals()[kw["loss_fn"]] if kw["loss_fn"] else None
    if "item_count" in kw:
        kw["step_kw"] = {"item_count": globals()[kw.pop("item_count")]}
    return worker(rank, world, name, mesh, options, **kw)


def trun(name, mesh, options, kw, world=4, timeout=400):
    from parallelizer.runtime import spawn
    try:
        return spawn(tworker, world, name, mesh, options, kw, timeout_s=timeout)
    except Exception as e:
        return f"SPAWN {type(e).__name__}: {str(e)[:1500]}"
