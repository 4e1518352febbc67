"""Small transformers families the zoo does not have (builders for rehearse: module-level, seeded)."""
import os
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
import transformers as T

B, S, V = 4, 12, 160


def _ids(seed=0, seq=S, low=0):
    return torch.randint(low, V, (B, seq), generator=torch.Generator().manual_seed(seed))


def _mk(cfg_cls, model_cls, sizes, device):
    defaults = cfg_cls()
    nod = {k: 0.0 for k, v in vars(defaults).items()
           if isinstance(v, float) and any(w in k for w in ("dropout", "pdrop", "layerdrop", "drop_path"))}
    torch.manual_seed(0)
    with torch.device(device):
        m = model_cls(cfg_cls(**{**nod, **sizes}))
    return m.train()


def _lm(cfg, mdl, sizes, device, low=0):
    ids = _ids(low=low)
    m = _mk(getattr(T, cfg), getattr(T, mdl), sizes, device)
    return m, (ids.to(device),), {"labels": ids.to(device)}


def bloom(device="cpu"):
    return _lm("BloomConfig", "BloomForCausalLM", dict(hidden_size=32, n_layer=2, n_head=4, vocab_size=V), device)


def falcon(device="cpu"):
    return _lm("FalconConfig", "FalconForCausalLM", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                         vocab_size=V), device)


def falcon_alibi(device="cpu"):
    return _lm("FalconConfig", "FalconForCausalLM", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                         vocab_size=V, alibi=True), device)


def opt(device="cpu"):
    return _lm("OPTConfig", "OPTForCausalLM", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                   ffn_dim=64, vocab_size=V, word_embed_proj_dim=32,
                                                   max_position_embeddings=64), device, low=2)


def gptj(device="cpu"):
    return _lm("GPTJConfig", "GPTJForCausalLM", dict(n_embd=32, n_layer=2, n_head=4, rotary_dim=4, vocab_size=V,
                                                     n_positions=64), device)


def codegen(device="cpu"):
    return _lm("CodeGenConfig", "CodeGenForCausalLM", dict(n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                                                           vocab_size=V, n_positions=64, n_ctx=64), device)


def phi3(device="cpu"):
    return _lm("Phi3Config", "Phi3ForCausalLM", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=V,
                                                     pad_token_id=0, max_position_embeddings=64), device)


def albert(device="cpu"):
    return _lm("AlbertConfig", "AlbertForMaskedLM", dict(embedding_size=16, hidden_size=32, num_hidden_layers=2,
                                                         num_attention_heads=4, intermediate_size=64,
                                                         vocab_size=V), device)


def distilbert(device="cpu"):
    return _lm("DistilBertConfig", "DistilBertForMaskedLM", dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                                                 vocab_size=V, max_position_embeddings=64), device)


def electra(device="cpu"):
    return _lm("ElectraConfig", "ElectraForMaskedLM", dict(embedding_size=16, hidden_size=32, num_hidden_layers=2,
                                                           num_attention_heads=4, intermediate_size=64,
                                                           vocab_size=V), device)


def deberta_v2(device="cpu"):
    return _lm("DebertaV2Config", "DebertaV2ForMaskedLM", dict(hidden_size=32, num_hidden_layers=2,
                                                               num_attention_heads=4, intermediate_size=64,
                                                               vocab_size=V, max_position_embeddings=64,
                                                               relative_attention=True, position_buckets=8,
                                                               pos_att_type=["p2c", "c2p"]), device)


def _img(cfg, mdl, sizes, device, n_labels=3, size=32):
    m = _mk(getattr(T, cfg), getattr(T, mdl), {**sizes, "num_labels": n_labels}, device)
    g = torch.Generator().manual_seed(0)
    px, y = torch.randn(B, 3, size, size, generator=g), torch.randint(0, n_labels, (B,), generator=g)
    return m, (px.to(device),), {"labels": y.to(device)}


def swin(device="cpu"):
    return _img("SwinConfig", "SwinForImageClassification", dict(image_size=32, patch_size=4, embed_dim=16,
                                                                 depths=[1, 1], num_heads=[2, 4], window_size=4),
                device)


def convnext(device="cpu"):
    return _img("ConvNextConfig", "ConvNextForImageClassification", dict(hidden_sizes=[8, 16], depths=[1, 1],
                                                                         num_stages=2), device)


def resnet(device="cpu"):
    return _img("ResNetConfig", "ResNetForImageClassification", dict(embedding_size=8, hidden_sizes=[8, 16],
                                                                     depths=[1, 1], layer_type="basic"), device)


def mobilevit(device="cpu"):
    return _img("MobileViTConfig", "MobileViTForImageClassification",
                dict(image_size=32, patch_size=2, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
                     num_attention_heads=2), device)


def t5_labels(device="cpu"):
    sizes = dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, vocab_size=V, decoder_start_token_id=0)
    m = _mk(T.T5Config, T.T5ForConditionalGeneration, sizes, device)
    return m, (_ids().to(device),), {"labels": _ids(1, seq=8).to(device)}


def build(name, device="cpu"):
    return globals()[name](device=device)


ALL = ["bloom", "falcon", "falcon_alibi", "opt", "gptj", "codegen", "phi3", "albert", "distilbert", "electra",
       "deberta_v2", "swin", "convnext", "resnet", "mobilevit", "t5_labels"]
