"""One small model per transformers family, built from its config class with the DEFAULT options.

Only sizes are made small (hidden size, layers, heads, vocabulary, positions, experts' width, image and
audio sizes) and every dropout probability is set to 0 so that a sharded run can be compared with one
device number by number; everything else is the config class's default: `use_cache=True`, the default
attention implementation (SDPA where the family has it), `return_dict=True`, tied embeddings where the
family ties them. Weights are random (seeded); nothing is downloaded.

Each builder returns `(model, args, kwargs)` in train mode, ready for `parallelizer.trace(*builder())`.
Inputs: token ids (batch 4, sequence 16) for text models, with `labels=` where the model computes its own
training loss (causal and masked LMs, BART, image classification); T5 gets `decoder_input_ids` instead,
because `T5Config()` has no `decoder_start_token_id` (released T5 checkpoints set it to 0), so T5 with
`labels=` fails in eager too.
"""
from __future__ import annotations

import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

BATCH, SEQ, VOCAB = 4, 16, 128
_TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=VOCAB)


def _ids(seed: int, seq: int = SEQ, low: int = 0) -> torch.Tensor:
    """Token ids (BATCH, seq) in [low, VOCAB), seeded."""
    return torch.randint(low, VOCAB, (BATCH, seq), generator=torch.Generator().manual_seed(seed))


def _build(config_cls, model_cls, sizes: dict, seed: int, device: str) -> torch.nn.Module:
    """`model_cls(config_cls(**sizes))` with every dropout (and LayerDrop) probability of the config set to 0."""
    defaults = config_cls()
    no_dropout = {k: 0.0 for k, v in vars(defaults).items()
                  if isinstance(v, float) and any(w in k for w in ("dropout", "pdrop", "layerdrop"))}
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_cls(config_cls(**{**no_dropout, **sizes}))
    return model.train()


def gpt2(seed: int = 0, device: str = "cpu"):
    """GPT2LMHeadModel (tied wte/lm_head, Conv1D layers), labels = input ids."""
    from transformers import GPT2Config, GPT2LMHeadModel

    ids = _ids(seed)
    model = _build(GPT2Config, GPT2LMHeadModel, dict(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB,
                                                     n_positions=64), seed, device)
    return model, (ids.to(device),), {"labels": ids.to(device)}


def _causal_lm(config_name: str, model_name: str, seed: int, device: str, **sizes):
    import transformers

    ids = _ids(seed)
    model = _build(getattr(transformers, config_name), getattr(transformers, model_name), {**_TEXT, **sizes},
                   seed, device)
    return model, (ids.to(device),), {"labels": ids.to(device)}


def llama(seed: int = 0, device: str = "cpu"):
    """LlamaForCausalLM: grouped-query attention (4 query heads, 2 KV heads), RMSNorm, rotary embeddings."""
    return _causal_lm("LlamaConfig", "LlamaForCausalLM", seed, device, num_key_value_heads=2)


def mistral(seed: int = 0, device: str = "cpu"):
    """MistralForCausalLM: GQA and sliding-window attention (default window 4096 > sequence)."""
    return _causal_lm("MistralConfig", "MistralForCausalLM", seed, device, num_key_value_heads=2)


def qwen2(seed: int = 0, device: str = "cpu"):
    """Qwen2ForCausalLM: GQA with biases on the q/k/v projections."""
    return _causal_lm("Qwen2Config", "Qwen2ForCausalLM", seed, device, num_key_value_heads=2)


def phi(seed: int = 0, device: str = "cpu"):
    """PhiForCausalLM: parallel attention and MLP, partial rotary embeddings, LayerNorm, biases."""
    return _causal_lm("PhiConfig", "PhiForCausalLM", seed, device)


def gpt_neox(seed: int = 0, device: str = "cpu"):
    """GPTNeoXForCausalLM: fused query_key_value projection, parallel residual, partial rotary."""
    return _causal_lm("GPTNeoXConfig", "GPTNeoXForCausalLM", seed, device)


def mixtral(seed: int = 0, device: str = "cpu"):
    """MixtralForCausalLM: sparse mixture of experts (default 8 experts, top-2 routing) and GQA."""
    return _causal_lm("MixtralConfig", "MixtralForCausalLM", seed, device, num_key_value_heads=2)


def mamba(seed: int = 0, device: str = "cpu"):
    """MambaForCausalLM: selective state-space layers (the slow, pure-PyTorch path on CPU)."""
    from transformers import MambaConfig, MambaForCausalLM

    ids = _ids(seed)
    model = _build(MambaConfig, MambaForCausalLM, dict(hidden_size=32, num_hidden_layers=2, vocab_size=VOCAB),
                   seed, device)
    return model, (ids.to(device),), {"labels": ids.to(device)}


def t5(seed: int = 0, device: str = "cpu"):
    """T5ForConditionalGeneration (encoder-decoder, relative position buckets, EncoderDecoderCache by default);
    inputs: input_ids (4, 16) and decoder_input_ids (4, 8)."""
    from transformers import T5Config, T5ForConditionalGeneration

    model = _build(T5Config, T5ForConditionalGeneration, dict(d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                                              num_heads=4, vocab_size=VOCAB), seed, device)
    return model, (_ids(seed).to(device),), {"decoder_input_ids": _ids(seed + 1, seq=8).to(device)}


def bart(seed: int = 0, device: str = "cpu"):
    """BartForConditionalGeneration (encoder-decoder, learned positions); labels (4, 8) give the loss."""
    from transformers import BartConfig, BartForConditionalGeneration

    sizes = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=VOCAB,
                 max_position_embeddings=64)
    model = _build(BartConfig, BartForConditionalGeneration, sizes, seed, device)
    return model, (_ids(seed, low=3).to(device),), {"labels": _ids(seed + 1, seq=8, low=3).to(device)}


def _masked_lm(config_name: str, model_name: str, seed: int, device: str, low: int = 0):
    import transformers

    ids = _ids(seed, low=low)
    model = _build(getattr(transformers, config_name), getattr(transformers, model_name), _TEXT, seed, device)
    return model, (ids.to(device),), {"labels": ids.to(device)}


def bert(seed: int = 0, device: str = "cpu"):
    """BertForMaskedLM (absolute positions, token types, tied decoder)."""
    return _masked_lm("BertConfig", "BertForMaskedLM", seed, device)


def roberta(seed: int = 0, device: str = "cpu"):
    """RobertaForMaskedLM (positions offset by the padding index; ids >= 2 so none is padding)."""
    return _masked_lm("RobertaConfig", "RobertaForMaskedLM", seed, device, low=2)


def vit(seed: int = 0, device: str = "cpu"):
    """ViTForImageClassification on (4, 3, 32, 32) images with patch 8 and the default 2 labels."""
    from transformers import ViTConfig, ViTForImageClassification

    sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32,
                 patch_size=8)
    model = _build(ViTConfig, ViTForImageClassification, sizes, seed, device)
    gen = torch.Generator().manual_seed(seed)
    pixels, labels = torch.randn(BATCH, 3, 32, 32, generator=gen), torch.randint(0, 2, (BATCH,), generator=gen)
    return model, (pixels.to(device),), {"labels": labels.to(device)}


def clip_text(seed: int = 0, device: str = "cpu"):
    """CLIPTextModel (causal mask, quick-GELU, pooled output at the end-of-text token)."""
    from transformers import CLIPTextConfig, CLIPTextModel

    model = _build(CLIPTextConfig, CLIPTextModel, _TEXT, seed, device)
    return model, (_ids(seed).to(device),), {}


def whisper_encoder(seed: int = 0, device: str = "cpu"):
    """Whisper's audio encoder (two 1-D convolutions, sinusoidal positions) on (4, 16 mel bins, 64 frames)."""
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    sizes = dict(d_model=32, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64, num_mel_bins=16,
                 max_source_positions=32, vocab_size=VOCAB)
    model = _build(WhisperConfig, WhisperEncoder, sizes, seed, device)
    features = torch.randn(BATCH, 16, 64, generator=torch.Generator().manual_seed(seed))
    return model, (features.to(device),), {}


FAMILIES = {"gpt2": gpt2, "llama": llama, "mistral": mistral, "qwen2": qwen2, "phi": phi, "gpt_neox": gpt_neox,
            "mixtral": mixtral, "t5": t5, "bart": bart, "bert": bert, "roberta": roberta, "vit": vit,
            "clip_text": clip_text, "whisper_encoder": whisper_encoder, "mamba": mamba}
