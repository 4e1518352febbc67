"""Trial builders (branch trial2): small transformers families and patterns nobody here tried yet.
Each builder(batch=4) -> (model, args, kwargs), seeded, dropout 0 unless said."""
from __future__ import annotations

import os

import torch
from torch import nn
import torch.nn.functional as F

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

V, S = 128, 8


def _ids(batch, seq=S, seed=0, low=0, vocab=V):
    return torch.randint(low, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _nodrop(cfg_cls, **sizes):
    d = cfg_cls()
    nd = {k: 0.0 for k, v in vars(d).items() if isinstance(v, float) and any(w in k for w in ("dropout", "pdrop", "layerdrop", "drop_path"))}
    return cfg_cls(**{**nd, **sizes})


def _lm(cfg_name, model_name, batch, **sizes):
    import transformers
    torch.manual_seed(0)
    cfg = _nodrop(getattr(transformers, cfg_name), **sizes)
    model = getattr(transformers, model_name)(cfg).train()
    ids = _ids(batch)
    return model, (ids,), {"labels": ids}


TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=V)


def mistral_sw(batch=4):
    """sliding window 3 < seq 8 (the catalog's window 4096 never bites)."""
    return _lm("MistralConfig", "MistralForCausalLM", batch, **TEXT, num_key_value_heads=2, sliding_window=3)


def qwen2_sw(batch=4):
    return _lm("Qwen2Config", "Qwen2ForCausalLM", batch, **TEXT, num_key_value_heads=2, use_sliding_window=True,
               sliding_window=3, max_window_layers=1)


def gemma(batch=4):
    return _lm("GemmaConfig", "GemmaForCausalLM", batch, **TEXT, num_key_value_heads=1, head_dim=8)


def gemma2(batch=4):
    return _lm("Gemma2Config", "Gemma2ForCausalLM", batch, **TEXT, num_key_value_heads=2, head_dim=8,
               sliding_window=4, attn_logit_softcapping=50.0, final_logit_softcapping=30.0)


def gpt_neox_partial(batch=4):
    return _lm("GPTNeoXConfig", "GPTNeoXForCausalLM", batch, **TEXT, rotary_pct=0.5, use_parallel_residual=True)


def gpt_bigcode(batch=4):
    import transformers
    torch.manual_seed(0)
    cfg = _nodrop(transformers.GPTBigCodeConfig, n_embd=32, n_layer=2, n_head=4, vocab_size=V, n_positions=32,
                  multi_query=True)
    model = transformers.GPTBigCodeForCausalLM(cfg).train()
    ids = _ids(batch)
    return model, (ids,), {"labels": ids}


def mixtral_aux(batch=4):
    return _lm("MixtralConfig", "MixtralForCausalLM", batch, **TEXT, num_key_value_heads=2, num_local_experts=4,
               num_experts_per_tok=2, output_router_logits=True, router_aux_loss_coef=0.1)


def qwen2_moe(batch=4):
    return _lm("Qwen2MoeConfig", "Qwen2MoeForCausalLM", batch, **TEXT, num_key_value_heads=2, num_experts=4,
               num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=32,
               output_router_logits=True, router_aux_loss_coef=0.1, decoder_sparse_step=1, mlp_only_layers=[])


def pegasus(batch=4):
    import transformers
    torch.manual_seed(0)
    cfg = _nodrop(transformers.PegasusConfig, d_model=32, encoder_layers=2, decoder_layers=2,
                  encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                  vocab_size=V, max_position_embeddings=32)
    model = transformers.PegasusForConditionalGeneration(cfg).train()
    return model, (_ids(batch, low=3),), {"labels": _ids(batch, seq=6, seed=1, low=3)}


def xlmr(batch=4):
    import transformers
    torch.manual_seed(0)
    cfg = _nodrop(transformers.XLMRobertaConfig, **TEXT)
    model = transformers.XLMRobertaForSequenceClassification(cfg).train()
    ids = _ids(batch, low=2)
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0
    mask[-1, 3:] = 0
    return model, (ids,), {"attention_mask": mask, "labels": torch.tensor([0, 1, 1, 0])[:batch]}


def mobilebert(batch=4):
    import transformers
    torch.manual_seed(0)
    cfg = _nodrop(transformers.MobileBertConfig, vocab_size=V, hidden_size=64, embedding_size=32,
                  num_hidden_layers=2, num_attention_heads=4, intermediate_size=32, intra_bottleneck_size=32,
                  true_hidden_size=32, num_feedforward_networks=2)
    model = transformers.MobileBertForMaskedLM(cfg).train()
    ids = _ids(batch)
    return model, (ids,), {"labels": ids}


def _img(batch, size=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, size, size, generator=g)


def deit(batch=4):
    import transformers
    torch.manual_seed(0)
    cfg = _nodrop(transformers.DeiTConfig, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, image_size=32, patch_size=8, num_labels=3)
    model = transformers.DeiTForImageClassificationWithTeacher(cfg).train()
    return model, (_img(batch),), {}


def beit(batch=4):
    import transformers
    torch.manual_seed(0)
    cfg = _nodrop(transformers.BeitConfig, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, image_size=32, patch_size=8, num_labels=3,
                  use_relative_position_bias=True, use_mean_pooling=True, layer_scale_init_value=0.1)
    model = transformers.BeitForImageClassification(cfg).train()
    return model, (_img(batch),), {"labels": torch.tensor([0, 1, 2, 1])[:batch]}


def segformer(batch=4):
    import transformers
    torch.manual_seed(0)
    cfg = _nodrop(transformers.SegformerConfig, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                  hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2],
                  mlp_ratios=[2, 2], decoder_hidden_size=32, num_labels=3)
    model = transformers.SegformerForSemanticSegmentation(cfg).train()
    labels = torch.randint(0, 3, (batch, 32, 32), generator=torch.Generator().manual_seed(2))
    labels[0, :4] = 255
    return model, (_img(batch),), {"labels": labels}


def clip(batch=4):
    import transformers
    torch.manual_seed(0)
    cfg = transformers.CLIPConfig(
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         vocab_size=V, max_position_embeddings=16),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           image_size=32, patch_size=8),
        projection_dim=16)
    model = transformers.CLIPModel(cfg).train()
    return model, (_ids(batch),), {"pixel_values": _img(batch), "return_loss": True}


def wav2vec2(batch=4):
    import transformers
    torch.manual_seed(0)
    cfg = _nodrop(transformers.Wav2Vec2Config, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                  num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4, vocab_size=12,
                  feat_extract_norm="group", mask_time_prob=0.0, ctc_loss_reduction="mean")
    model = transformers.Wav2Vec2ForSequenceClassification(cfg).train()
    g = torch.Generator().manual_seed(3)
    audio = torch.randn(batch, 400, generator=g)
    return model, (audio,), {"labels": torch.tensor([0, 1, 1, 0])[:batch]}


def wav2vec2_ctc(batch=4):
    """(Wav2Vec2ForCTC's label check `labels.max() >= vocab_size` is data-dependent: expected TraceError)."""
    import transformers
    torch.manual_seed(0)
    cfg = _nodrop(transformers.Wav2Vec2Config, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                  num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4, vocab_size=12,
                  feat_extract_norm="group", mask_time_prob=0.0)
    model = transformers.Wav2Vec2ForCTC(cfg).train()
    g = torch.Generator().manual_seed(3)
    return model, (torch.randn(batch, 400, generator=g),), {"labels": torch.randint(1, 12, (batch, 5), generator=g)}


def wav2vec2_default(batch=4):
    """Wav2Vec2ForCTC with the default config except sizes: SpecAugment time masking on (mask_time_prob=0.05)."""
    import transformers
    torch.manual_seed(0)
    cfg = _nodrop(transformers.Wav2Vec2Config, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                  num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4, vocab_size=12,
                  feat_extract_norm="group", mask_time_prob=0.5, mask_time_length=2)
    model = transformers.Wav2Vec2Model(cfg).train()
    g = torch.Generator().manual_seed(3)
    return model, (torch.randn(batch, 400, generator=g),), {}


def qwen2_default(batch=4):
    """Qwen2 with the config's defaults (dropout 0.0 already, cache on), sizes only."""
    import transformers
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**TEXT, num_key_value_heads=2)).train()
    ids = _ids(batch)
    return model, (ids,), {"labels": ids}


def gpt2_dropout(batch=4):
    """GPT-2 with its DEFAULT dropouts (0.1 everywhere): as a user would train it."""
    import transformers
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=V,
                                                                 n_positions=32)).train()
    ids = _ids(batch)
    return model, (ids,), {"labels": ids}


FAMILIES = {f.__name__: f for f in (mistral_sw, qwen2_sw, gemma, gemma2, gpt_neox_partial, gpt_bigcode, mixtral_aux,
                                    qwen2_moe, pegasus, xlmr, mobilebert, deit, beit, segformer, clip, wav2vec2,
                                    wav2vec2_default, qwen2_default, gpt2_dropout)}
