"""CLI factories for pipeline meshes: factory(batch=..., seq_len=..., device=...) -> (model, args, kwargs)."""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import transformers as T
from hf_models import _mk

V = 160


def _lm(cfg, mdl, sizes, batch, seq_len, device, low=0):
    ids = torch.randint(low, V, (batch or 8, seq_len or 12), generator=torch.Generator().manual_seed(0))
    m = _mk(getattr(T, cfg), getattr(T, mdl), sizes, device)
    return m, (ids.to(device),), {"labels": ids.to(device)}


def bloom(batch=8, seq_len=12, device="cpu", **kw):
    return _lm("BloomConfig", "BloomForCausalLM", dict(hidden_size=32, n_layer=4, n_head=4, vocab_size=V), batch, seq_len, device)


def opt(batch=8, seq_len=12, device="cpu", **kw):
    return _lm("OPTConfig", "OPTForCausalLM", dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, ffn_dim=64,
                                                   vocab_size=V, word_embed_proj_dim=32, max_position_embeddings=64),
               batch, seq_len, device, low=2)


def gptj(batch=8, seq_len=12, device="cpu", **kw):
    return _lm("GPTJConfig", "GPTJForCausalLM", dict(n_embd=32, n_layer=4, n_head=4, rotary_dim=4, vocab_size=V, n_positions=64),
               batch, seq_len, device)


def distilbert(batch=8, seq_len=12, device="cpu", **kw):
    return _lm("DistilBertConfig", "DistilBertForMaskedLM", dict(dim=32, n_layers=4, n_heads=4, hidden_dim=64, vocab_size=V,
                                                                 max_position_embeddings=64), batch, seq_len, device)


def falcon(batch=8, seq_len=12, device="cpu", **kw):
    return _lm("FalconConfig", "FalconForCausalLM", dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, vocab_size=V),
               batch, seq_len, device)


def albert(batch=8, seq_len=12, device="cpu", **kw):
    return _lm("AlbertConfig", "AlbertForMaskedLM", dict(embedding_size=16, hidden_size=32, num_hidden_layers=4,
                                                         num_attention_heads=4, intermediate_size=64, vocab_size=V),
               batch, seq_len, device)


def electra_padded(batch=8, seq_len=12, device="cpu", **kw):
    """labels with -100 in uneven amounts per microbatch."""
    m, a, k = _lm("ElectraConfig", "ElectraForMaskedLM", dict(embedding_size=16, hidden_size=32, num_hidden_layers=4,
                                                              num_attention_heads=4, intermediate_size=64, vocab_size=V),
                  batch, seq_len, device)
    y = k["labels"].clone()
    y[: (batch or 8) // 2, 2:] = -100
    return m, a, {"labels": y}
