"""Round 9 (d): transformers models reaching the new rows (_weight_norm, histc / one_hot, repeat_interleave, numpy_T)."""
import os
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from parallelizer.zoo.families import _build, _ids, _TEXT, VOCAB

BATCH = 4


def _lm(cfg, cls, seed=0, **sizes):
    import transformers
    ids = _ids(seed)
    m = _build(getattr(transformers, cfg), getattr(transformers, cls), {**_TEXT, **sizes}, seed, "cpu")
    return m, (ids,), {"labels": ids}


def mixtral():
    return _lm("MixtralConfig", "MixtralForCausalLM", num_key_value_heads=2, num_local_experts=4,
               output_router_logits=True, router_aux_loss_coef=0.1)


def qwen2_moe():
    return _lm("Qwen2MoeConfig", "Qwen2MoeForCausalLM", num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
               moe_intermediate_size=32, shared_expert_intermediate_size=32, output_router_logits=True,
               router_aux_loss_coef=0.1)


def cohere():
    return _lm("CohereConfig", "CohereForCausalLM", num_key_value_heads=2)


def falcon():
    import transformers
    ids = _ids(0)
    m = _build(transformers.FalconConfig, transformers.FalconForCausalLM,
               dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, vocab_size=VOCAB), 0, "cpu")
    return m, (ids,), {"labels": ids}


def _audio(cfg, cls):
    import transformers
    sizes = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                 conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=4,
                 num_conv_pos_embedding_groups=2, mask_time_prob=0.0, num_labels=3)
    m = _build(getattr(transformers, cfg), getattr(transformers, cls), sizes, 0, "cpu")
    g = torch.Generator().manual_seed(7)
    return m, (torch.randn(BATCH, 400, generator=g),), {"labels": torch.randint(0, 3, (BATCH,), generator=g)}


def wav2vec2():
    return _audio("Wav2Vec2Config", "Wav2Vec2ForSequenceClassification")


def hubert():
    return _audio("HubertConfig", "HubertForSequenceClassification")


BUILDERS = {"mixtral": mixtral, "qwen2_moe": qwen2_moe, "cohere": cohere, "falcon": falcon, "wav2vec2": wav2vec2,
            "hubert": hubert}
