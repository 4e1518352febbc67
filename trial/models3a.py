"""Small builders for transformers families not tried before (trial3a). build(name) -> (model, args, kwargs)."""
from __future__ import annotations
import os
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
import transformers as T

B, S, V = 4, 16, 128
TXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=V)


def _nodrop(cfg_cls, sizes):
    d = cfg_cls()
    nd = {k: 0.0 for k, v in vars(d).items() if isinstance(v, float) and any(w in k for w in ("dropout", "pdrop", "layerdrop", "drop_path"))}
    return cfg_cls(**{**nd, **sizes})


def _ids(seed, seq=S, low=0, b=B):
    return torch.randint(low, V, (b, seq), generator=torch.Generator().manual_seed(seed))


def _mk(cfg, mdl, sizes, seed=0, device="cpu"):
    torch.manual_seed(seed)
    with torch.device(device):
        m = getattr(T, mdl)(_nodrop(getattr(T, cfg), sizes))
    return m.train()


def causal(cfg, mdl, **extra):
    def f(device="cpu", batch=B, seq_len=S, **kw):
        m = _mk(cfg, mdl, {**TXT, **extra, **kw}, device=device)
        ids = _ids(1, seq=seq_len, b=batch).to(device)
        return m, (ids,), {"labels": ids}
    return f


def masked(cfg, mdl, low=0, **extra):
    def f(device="cpu", batch=B, **kw):
        m = _mk(cfg, mdl, {**TXT, **extra}, device=device)
        ids = _ids(1, low=low, b=batch).to(device)
        return m, (ids,), {"labels": ids}
    return f


def bart(device="cpu", batch=B, **kw):
    sizes = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                 encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=V, max_position_embeddings=64)
    m = _mk("BartConfig", "BartForConditionalGeneration", sizes, device=device)
    return m, (_ids(1, low=3, b=batch).to(device),), {"labels": _ids(2, seq=8, low=3, b=batch).to(device)}


def marian(device="cpu", batch=B, **kw):
    sizes = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                 encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=V, max_position_embeddings=64,
                 pad_token_id=V - 1, decoder_start_token_id=V - 1)
    m = _mk("MarianConfig", "MarianMTModel", sizes, device=device)
    return m, (_ids(1, low=0, b=batch).clamp(max=V - 2).to(device),), {"labels": _ids(2, seq=8, b=batch).clamp(max=V - 2).to(device)}


def whisper(device="cpu", batch=B, **kw):
    sizes = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                 encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=V, num_mel_bins=8, max_source_positions=16,
                 max_target_positions=32, pad_token_id=V - 1, decoder_start_token_id=V - 2, eos_token_id=V - 3,
                 bos_token_id=V - 3, suppress_tokens=None, begin_suppress_tokens=None)
    m = _mk("WhisperConfig", "WhisperForConditionalGeneration", sizes, device=device)
    feats = torch.randn(batch, 8, 32, generator=torch.Generator().manual_seed(3)).to(device)
    return m, (feats,), {"labels": _ids(2, seq=8, b=batch).clamp(max=V - 4).to(device)}


def xlnet(device="cpu", batch=B, **kw):
    sizes = dict(d_model=32, n_layer=2, n_head=4, d_inner=64, vocab_size=V)
    m = _mk("XLNetConfig", "XLNetLMHeadModel", sizes, device=device)
    ids = _ids(1, b=batch).to(device)
    return m, (ids,), {"labels": ids}


def funnel(device="cpu", batch=B, **kw):
    sizes = dict(d_model=32, n_head=4, d_head=8, d_inner=64, block_sizes=[1, 1], vocab_size=V, num_decoder_layers=1)
    m = _mk("FunnelConfig", "FunnelForMaskedLM", sizes, device=device)
    ids = _ids(1, b=batch).to(device)
    return m, (ids,), {"labels": ids}


def bigbird(device="cpu", batch=B, **kw):
    m = _mk("BigBirdConfig", "BigBirdForMaskedLM", {**TXT, "attention_type": "original_full", "max_position_embeddings": 64}, device=device)
    ids = _ids(1, b=batch).to(device)
    return m, (ids,), {"labels": ids}


def layoutlm(device="cpu", batch=B, **kw):
    m = _mk("LayoutLMConfig", "LayoutLMForMaskedLM", {**TXT, "max_2d_position_embeddings": 64}, device=device)
    ids = _ids(1, b=batch).to(device)
    g = torch.Generator().manual_seed(5)
    x0 = torch.randint(0, 30, (batch, S, 2), generator=g)
    bbox = torch.cat([x0, x0 + torch.randint(0, 30, (batch, S, 2), generator=g)], -1)[..., [0, 1, 2, 3]].to(device)
    return m, (ids, bbox.long()), {"labels": ids}


def _img(seed, n=3, hw=32, b=B):
    return torch.randn(b, n, hw, hw, generator=torch.Generator().manual_seed(seed))


def dinov2(device="cpu", batch=B, **kw):
    m = _mk("Dinov2Config", "Dinov2ForImageClassification", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            mlp_ratio=2, image_size=32, patch_size=8, num_labels=3), device=device)
    return m, (_img(3, b=batch).to(device),), {"labels": torch.tensor([0, 1, 2, 1] * (batch // 4 + 1))[:batch].to(device)}


def convnextv2(device="cpu", batch=B, **kw):
    m = _mk("ConvNextV2Config", "ConvNextV2ForImageClassification", dict(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=3, image_size=32), device=device)
    return m, (_img(3, b=batch).to(device),), {"labels": torch.tensor([0, 1, 2, 1] * (batch // 4 + 1))[:batch].to(device)}


def regnet(device="cpu", batch=B, **kw):
    m = _mk("RegNetConfig", "RegNetForImageClassification", dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], groups_width=4, num_labels=3), device=device)
    return m, (_img(3, b=batch).to(device),), {"labels": torch.tensor([0, 1, 2, 1] * (batch // 4 + 1))[:batch].to(device)}


def efficientnet(device="cpu", batch=B, **kw):
    m = _mk("EfficientNetConfig", "EfficientNetForImageClassification", dict(image_size=32, width_coefficient=0.25, depth_coefficient=0.25,
            hidden_dim=320, num_labels=3), device=device)
    return m, (_img(3, b=batch).to(device),), {"labels": torch.tensor([0, 1, 2, 1] * (batch // 4 + 1))[:batch].to(device)}


def swinv2(device="cpu", batch=B, **kw):
    m = _mk("Swinv2Config", "Swinv2ForImageClassification", dict(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
            num_heads=[2, 4], window_size=4, num_labels=3), device=device)
    return m, (_img(3, b=batch).to(device),), {"labels": torch.tensor([0, 1, 2, 1] * (batch // 4 + 1))[:batch].to(device)}


def mpt(device="cpu", batch=B, **kw):
    m = _mk("MptConfig", "MptForCausalLM", dict(d_model=32, n_heads=4, n_layers=2, expansion_ratio=2, vocab_size=V, max_seq_len=64), device=device)
    ids = _ids(1, b=batch).to(device)
    return m, (ids,), {"labels": ids}


def mamba(device="cpu", batch=B, **kw):
    m = _mk("MambaConfig", "MambaForCausalLM", dict(hidden_size=32, num_hidden_layers=2, vocab_size=V, state_size=8), device=device)
    ids = _ids(1, b=batch).to(device)
    return m, (ids,), {"labels": ids}


def rwkv(device="cpu", batch=B, **kw):
    m = _mk("RwkvConfig", "RwkvForCausalLM", dict(hidden_size=32, num_hidden_layers=2, vocab_size=V, attention_hidden_size=32,
            intermediate_size=64, context_length=64), device=device)
    ids = _ids(1, b=batch).to(device)
    return m, (ids,), {"labels": ids}


def dbrx(device="cpu", batch=B, **kw):
    m = _mk("DbrxConfig", "DbrxForCausalLM", dict(d_model=32, n_heads=4, n_layers=2, max_seq_len=64, vocab_size=V,
            attn_config={"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0}, ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2}), device=device)
    ids = _ids(1, b=batch).to(device)
    return m, (ids,), {"labels": ids}


MODELS = {
    "bart": bart, "whisper": whisper, "marian": marian, "xlnet": xlnet, "funnel": funnel,
    "roberta_pln": masked("RobertaPreLayerNormConfig", "RobertaPreLayerNormForMaskedLM", low=2),
    "bigbird": bigbird, "layoutlm": layoutlm, "dinov2": dinov2, "convnextv2": convnextv2, "regnet": regnet,
    "efficientnet": efficientnet, "swinv2": swinv2,
    "olmo": causal("OlmoConfig", "OlmoForCausalLM"), "olmo2": causal("Olmo2Config", "Olmo2ForCausalLM"),
    "cohere": causal("CohereConfig", "CohereForCausalLM", num_key_value_heads=2),
    "stablelm": causal("StableLmConfig", "StableLmForCausalLM", num_key_value_heads=2),
    "phi": causal("PhiConfig", "PhiForCausalLM"),
    "persimmon": causal("PersimmonConfig", "PersimmonForCausalLM"),
    "starcoder2": causal("Starcoder2Config", "Starcoder2ForCausalLM", num_key_value_heads=2),
    "granite": causal("GraniteConfig", "GraniteForCausalLM", num_key_value_heads=2),
    "mpt": mpt, "mamba": mamba, "rwkv": rwkv, "dbrx": dbrx,
    "qwen3": causal("Qwen3Config", "Qwen3ForCausalLM", num_key_value_heads=2, head_dim=8),
    "qwen3_moe": causal("Qwen3MoeConfig", "Qwen3MoeForCausalLM", num_key_value_heads=2, head_dim=8, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2, output_router_logits=True),
    "olmoe": causal("OlmoeConfig", "OlmoeForCausalLM", num_experts=4, num_experts_per_tok=2, output_router_logits=True),
    "granitemoe": causal("GraniteMoeConfig", "GraniteMoeForCausalLM", num_local_experts=4, num_experts_per_tok=2, output_router_logits=True),
}


def build(name, device="cpu", batch=B, **kw):
    return MODELS[name](device=device, batch=batch)


for _n, _f in MODELS.items():
    globals().setdefault(_n, _f)
