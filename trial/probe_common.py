"""Shared helpers for the round-10a input-kind probes: tiny transformers models and a comparison of a
ParallelModule against the same user code on one device."""
import copy
import traceback

import torch

V, HID, T, B = 128, 32, 8, 4


def llama(**extra):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=HID, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      attn_implementation="eager", **extra)
    return LlamaForCausalLM(cfg)


def bert(**extra):
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=V, hidden_size=HID, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, max_position_embeddings=64, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, num_labels=3, attn_implementation="eager", **extra)
    return BertForSequenceClassification(cfg)


def ids(b=B, t=T, seed=1, dtype=torch.int64):
    return torch.randint(0, V, (b, t), generator=torch.Generator().manual_seed(seed)).to(dtype)


def err(exc):
    return f"{type(exc).__module__}.{type(exc).__name__}: {str(exc)[:300]}"


def leaf(out, path):
    """out.<path> where path is a python expression on `out`."""
    return eval("out" + path, {"out": out})


def pm_full_grads(pm):
    """Full parameter gradients of pm via an SGD(lr=1) step and full_state_dict (collective)."""
    before = {k: v.clone() for k, v in pm.full_state_dict().items()}
    with torch.no_grad():
        for p in pm.parameters():
            if p.grad is not None:
                p.sub_(p.grad)
    after = {k: v.clone() for k, v in pm.full_state_dict().items()}
    with torch.no_grad():
        for p in pm.parameters():
            if p.grad is not None:
                p.add_(p.grad)
    return {k: before[k] - after[k] for k in before}


def ref_grads(ref):
    return {k: (p.grad if p.grad is not None else torch.zeros_like(p)) for k, p in ref.named_parameters()}


def compare(a, b):
    """max |a-b| / (atol + rtol |b|) with torch.testing float32 defaults (a float64 scale of 1 for grads
    recovered from an SGD step: the parameter rounding there is below 1e-6 of the weight)."""
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).abs() / (1e-5 + 1.3e-6 * b.abs())).max().item()


def grad_ratio(pm, ref):
    g, r = pm_full_grads(pm), ref_grads(ref)
    worst, name = 0.0, None
    for k, v in r.items():
        if k in g:
            c = compare(g[k], v)
            if c > worst:
                worst, name = c, k
    return worst, name
