"""Tiny transformers models of families not tried before (trial5b). `build(family, default=False)` returns
(model, args, kwargs); default=True keeps the family's default config except sizes (dropout as configured)."""
from __future__ import annotations

import torch
import transformers as tf

B, T, V, H = 4, 8, 128, 32
SMALL = dict(hidden_size=H, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=V, max_position_embeddings=64, head_dim=8)
NODROP = ("hidden_dropout_prob", "attention_probs_dropout_prob", "attention_dropout", "hidden_dropout", "dropout",
          "embedding_dropout", "mlp_dropout", "resid_dropout", "classifier_dropout", "activation_dropout",
          "embd_pdrop", "resid_pdrop", "attn_pdrop", "dropout_rate", "attention_dropout_prob", "drop_path_rate",
          "embedding_dropout_prob", "feat_proj_dropout", "final_dropout", "layerdrop", "encoder_layerdrop",
          "decoder_layerdrop", "hidden_dropout_rate", "attention_probs_dropout", "mask_time_prob", "ff_dropout",
          "positional_dropout", "feat_extract_dropout", "layer_dropout", "hidden_act_dropout", "embed_dropout",
          "rnn_dropout", "attn_dropout", "mamba_dropout", "proj_dropout", "emb_dropout", "cross_attention_dropout")


def _ids(*shape, hi=V, seed=2):
    return torch.randint(0, hi, shape, generator=torch.Generator().manual_seed(seed))


def _x(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _cfg(cls, default, **kw):
    cfg = cls(**kw)
    if not default:
        for k in NODROP:
            if hasattr(cfg, k) and isinstance(getattr(cfg, k), float):
                setattr(cfg, k, 0.0)
    return cfg


def _lm(cfg_cls, model_cls, default, **kw):
    cfg = _cfg(getattr(tf, cfg_cls), default, **kw)
    model = getattr(tf, model_cls)(cfg)
    ids = _ids(B, T)
    return model, (ids,), {"labels": ids.clone()}


def _small(**over):
    d = dict(SMALL)
    d.update(over)
    return {k: v for k, v in d.items() if v is not None}


def build(family: str, default: bool = False):
    torch.manual_seed(0)
    f, d = family, default
    if f == "modernbert":
        cfg = _cfg(tf.ModernBertConfig, d, **_small(num_key_value_heads=None, head_dim=None), global_attn_every_n_layers=2,
                   local_attention=4, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
        model = tf.ModernBertForMaskedLM(cfg)
        ids = _ids(B, T, hi=V)
        ids[:, 0] = 1
        mask = torch.ones(B, T, dtype=torch.long)
        mask[1 % B, 5:] = 0
        mask[3 % B, 6:] = 0
        labels = torch.full((B, T), -100)
        labels[:, 2:5] = ids[:, 2:5]
        return model, (ids,), {"attention_mask": mask, "labels": labels}
    if f == "deepseek_v3":
        return _lm("DeepseekV3Config", "DeepseekV3ForCausalLM", d, **_small(head_dim=None, num_key_value_heads=4),
                   moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                   first_k_dense_replace=1, n_group=2, topk_group=1, q_lora_rank=16, kv_lora_rank=8,
                   qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, routed_scaling_factor=1.0)
    if f == "deepseek_v2":
        return _lm("DeepseekV2Config", "DeepseekV2ForCausalLM", d, **_small(head_dim=None, num_key_value_heads=4),
                   moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                   first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4,
                   v_head_dim=8, n_group=1, topk_group=1)
    if f == "gemma3":
        return _lm("Gemma3TextConfig", "Gemma3ForCausalLM", d, **_small(), sliding_window=4,
                   layer_types=["sliding_attention", "full_attention"])
    if f == "llama4":
        return _lm("Llama4TextConfig", "Llama4ForCausalLM", d, **_small(), intermediate_size_mlp=64, num_local_experts=4,
                   num_experts_per_tok=1, interleave_moe_layer_step=1, attention_chunk_size=4,
                   no_rope_layers=[1, 0], moe_layers=[0, 1])
    if f == "jamba":
        return _lm("JambaConfig", "JambaForCausalLM", d, **_small(head_dim=None), num_experts=2, num_experts_per_tok=1,
                   expert_layer_period=2, expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1,
                   mamba_d_state=4, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4, use_mamba_kernels=False)
    if f == "zamba2":
        return _lm("Zamba2Config", "Zamba2ForCausalLM", d, **_small(head_dim=None, intermediate_size=None),
                   mamba_d_state=8, mamba_headdim=8, mamba_ngroups=1, n_mamba_heads=8, num_mem_blocks=1,
                   layers_block_type=["mamba", "hybrid"], use_mem_rope=True, adapter_rank=4)
    if f == "mamba2":
        return _lm("Mamba2Config", "Mamba2ForCausalLM", d, hidden_size=H, num_hidden_layers=2, vocab_size=V,
                   state_size=8, num_heads=8, head_dim=8, n_groups=1, expand=2, chunk_size=4)
    if f == "falcon_mamba":
        return _lm("FalconMambaConfig", "FalconMambaForCausalLM", d, hidden_size=H, num_hidden_layers=2, vocab_size=V,
                   state_size=4, expand=2, conv_kernel=4)
    if f == "recurrent_gemma":
        return _lm("RecurrentGemmaConfig", "RecurrentGemmaForCausalLM", d, hidden_size=H, intermediate_size=64,
                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=V, lru_width=H,
                   attention_window_size=4, block_types=["recurrent", "attention"], conv1d_width=4,
                   logits_soft_cap=30.0)
    if f == "longformer":
        cfg = _cfg(tf.LongformerConfig, d, hidden_size=H, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, vocab_size=V, attention_window=[4, 4], max_position_embeddings=64,
                   pad_token_id=1)
        model = tf.LongformerForMaskedLM(cfg)
        ids = _ids(B, T)
        return model, (ids,), {"labels": ids.clone()}
    if f == "fnet":
        cfg = _cfg(tf.FNetConfig, d, hidden_size=H, intermediate_size=64, num_hidden_layers=2, vocab_size=V,
                   max_position_embeddings=64, use_tpu_fourier_optimizations=False)
        model = tf.FNetForMaskedLM(cfg)
        ids = _ids(B, T)
        return model, (ids,), {"labels": ids.clone()}
    if f == "nemotron":
        return _lm("NemotronConfig", "NemotronForCausalLM", d, **_small(), partial_rotary_factor=0.5)
    if f == "phimoe":
        return _lm("PhimoeConfig", "PhimoeForCausalLM", d, **_small(head_dim=None), num_local_experts=4,
                   num_experts_per_tok=2)
    if f == "glm":
        return _lm("GlmConfig", "GlmForCausalLM", d, **_small(), pad_token_id=0)
    if f == "glm4":
        return _lm("Glm4Config", "Glm4ForCausalLM", d, **_small(), pad_token_id=0)
    if f == "exaone4":
        return _lm("Exaone4Config", "Exaone4ForCausalLM", d, **_small(), sliding_window=4,
                   layer_types=["sliding_attention", "full_attention"])
    if f == "helium":
        return _lm("HeliumConfig", "HeliumForCausalLM", d, **_small())
    if f == "bamba":
        return _lm("BambaConfig", "BambaForCausalLM", d, **_small(head_dim=None), attn_layer_indices=[1],
                   mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=1, mamba_d_state=8, mamba_d_conv=4,
                   mamba_expand=2, mamba_chunk_size=4)
    if f == "cohere2":
        return _lm("Cohere2Config", "Cohere2ForCausalLM", d, **_small(head_dim=None), sliding_window=4,
                   layer_types=["sliding_attention", "full_attention"])
    if f == "gpt_oss":
        return _lm("GptOssConfig", "GptOssForCausalLM", d, **_small(), num_local_experts=4, num_experts_per_tok=2,
                   sliding_window=4, layer_types=["sliding_attention", "full_attention"])
    if f == "qwen3_next":
        return _lm("Qwen3NextConfig", "Qwen3NextForCausalLM", d, **_small(), num_experts=4, num_experts_per_tok=2,
                   moe_intermediate_size=16, shared_expert_intermediate_size=16, linear_num_value_heads=4,
                   linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4,
                   layer_types=["linear_attention", "full_attention"])
    if f == "smollm3":
        return _lm("SmolLM3Config", "SmolLM3ForCausalLM", d, **_small(head_dim=None), no_rope_layers=[1, 0],
                   pad_token_id=0)
    if f == "dots1":
        return _lm("Dots1Config", "Dots1ForCausalLM", d, **_small(), moe_intermediate_size=16, n_routed_experts=4,
                   num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1)
    if f == "siglip":
        cfg = _cfg(tf.SiglipVisionConfig, d, hidden_size=H, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, image_size=16, patch_size=4)
        return tf.SiglipVisionModel(cfg), (_x(B, 3, 16, 16),), {}
    if f == "hiera":
        cfg = _cfg(tf.HieraConfig, d, embed_dim=16, image_size=[32, 32], patch_size=[3, 3], patch_stride=[2, 2],
                   patch_padding=[1, 1], depths=[1, 1], num_heads=[1, 2], query_stride=[2, 2],
                   masked_unit_size=[4, 4], num_query_pool=1, num_labels=5)
        return tf.HieraForImageClassification(cfg), (_x(B, 3, 32, 32),), {"labels": _ids(B, hi=5)}
    if f == "dinov2_reg":
        cfg = _cfg(tf.Dinov2WithRegistersConfig, d, hidden_size=H, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, image_size=16, patch_size=4, num_register_tokens=2, num_labels=5)
        return tf.Dinov2WithRegistersForImageClassification(cfg), (_x(B, 3, 16, 16),), {"labels": _ids(B, hi=5)}
    if f == "data2vec_text":
        cfg = _cfg(tf.Data2VecTextConfig, d, hidden_size=H, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, vocab_size=V, max_position_embeddings=64)
        ids = _ids(B, T)
        return tf.Data2VecTextForMaskedLM(cfg), (ids,), {"labels": ids.clone()}
    if f == "blip_text":
        cfg = _cfg(tf.BlipTextConfig, d, hidden_size=H, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, vocab_size=V, max_position_embeddings=64, encoder_hidden_size=H)
        ids = _ids(B, T)
        return tf.BlipTextLMHeadModel(cfg), (ids,), {"labels": ids.clone(), "encoder_hidden_states": _x(B, 5, H)}
    if f == "idefics3_vision":
        cfg = _cfg(tf.Idefics3VisionConfig, d, hidden_size=H, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, image_size=16, patch_size=4)
        from transformers.models.idefics3.modeling_idefics3 import Idefics3VisionTransformer
        return Idefics3VisionTransformer(cfg), (_x(B, 3, 16, 16),), {}
    if f == "sew":
        cfg = _cfg(tf.SEWConfig, d, hidden_size=H, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=8,
                   num_conv_pos_embedding_groups=4, squeeze_factor=2, mask_time_prob=0.0 if not d else 0.05)
        return tf.SEWModel(cfg), (_x(B, 400),), {}
    if f == "patchtst":
        cfg = _cfg(tf.PatchTSTConfig, d, num_input_channels=3, context_length=32, patch_length=8, patch_stride=8,
                   prediction_length=8, d_model=H, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64)
        return tf.PatchTSTForPrediction(cfg), (_x(B, 32, 3),), {"future_values": _x(B, 8, 3, seed=3)}
    if f == "perceiver":
        cfg = _cfg(tf.PerceiverConfig, d, num_latents=8, d_latents=H, d_model=H, num_blocks=1,
                   num_self_attends_per_block=2, num_self_attention_heads=4, num_cross_attention_heads=4,
                   vocab_size=V, max_position_embeddings=T)
        ids = _ids(B, T)
        return tf.PerceiverForMaskedLM(cfg), (), {"inputs": ids, "labels": ids.clone()}
    if f in ("llama_bf16", "llama_fp16"):
        model, args, kwargs = _lm("LlamaConfig", "LlamaForCausalLM", d, **_small())
        return model.to(torch.bfloat16 if f == "llama_bf16" else torch.float16), args, kwargs
    if f == "deepseek_v3_moe":  # every layer MoE (no dense first layer), so the layers are identical for pp
        return _lm("DeepseekV3Config", "DeepseekV3ForCausalLM", d, **_small(head_dim=None, num_key_value_heads=4),
                   moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                   first_k_dense_replace=0, n_group=2, topk_group=1, q_lora_rank=16, kv_lora_rank=8,
                   qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, routed_scaling_factor=1.0)
    raise KeyError(family)


FAMILIES = ["modernbert", "deepseek_v3", "deepseek_v2", "gemma3", "llama4", "jamba", "zamba2", "mamba2", "falcon_mamba",
            "recurrent_gemma", "longformer", "fnet", "nemotron", "phimoe", "glm", "glm4", "exaone4", "helium", "bamba",
            "cohere2", "gpt_oss", "qwen3_next", "smollm3", "dots1", "siglip", "hiera", "dinov2_reg", "data2vec_text",
            "blip_text", "idefics3_vision", "sew", "patchtst", "perceiver"]


class _Layer(torch.nn.Module):
    """A layer whose `attn` part repeats but whose MLP differs between layers (DeepSeek-V3's dense then MoE)."""

    def __init__(self, extra):
        super().__init__()
        nn = torch.nn
        self.attn, self.extra = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 16)), extra
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)) if extra else nn.Linear(16, 16)

    def forward(self, x):
        h = x + self.attn(x)
        return h + self.mlp(h)


class MixedLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([_Layer(False), _Layer(True)])
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x).pow(2).mean()


def mixed_layers(batch=4, **kw):
    torch.manual_seed(0)
    return MixedLayers(), (_x(batch, 16),)
