"""Builders for transformers models from configs with random weights (no hub downloads).

Each builder returns `(model, example_inputs)` (plus example keyword inputs with `labels=True`) with the model in train mode on `device` ("cpu" or "meta")
and dropout set by `dropout` (0.0 by default so numerics are deterministic). `overrides` go to the config.
Attention defaults to the "eager" implementation: with real CPU weights, export's decompositions of the
SDPA path fail on GPT-2 (measured with torch 2.13, transformers 5.24); pass attn_implementation="sdpa" to change it.
"""
from __future__ import annotations

import functools
import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _build(model_cls, config, device, seed: int):
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_cls(config)
    if getattr(model, "loss_type", "") is None and model_cls.__name__.endswith("LMHeadModel"):
        # transformers derives the loss from the class name; GPT2LMHeadModel's does not say "ForCausalLM",
        # so it warns on every loss (once per process, i.e. per rank) before using that loss anyway: name it
        model.loss_type = "ForCausalLM"
    return model.train()


def _token_ids(batch: int, seq_len: int, vocab: int, device, seed: int) -> torch.Tensor:
    ids = torch.randint(0, vocab, (batch, seq_len), generator=torch.Generator().manual_seed(seed))
    return ids.to(device)


RETURNS = ("all", "loss")


def _with_labels(model, ids: torch.Tensor, labels: bool, returns: str = "all"):
    """(model, (ids,)) or, with labels, (model, (ids,), {"labels": ...}): the causal-LM loss becomes the model's
    first output. The first sample's first quarter of labels is -100 (ignored), so batch shards hold
    different numbers of counted tokens (a sharded mean must divide by the global count).

    returns: "all" (transformers' output: the loss, the logits, ...) or, with labels, "loss": the model's class
    becomes a subclass whose forward returns `.loss` alone (`loss_only`: same modules and state-dict keys), what
    a training step reads; its plans neither gather nor hold the logits (the CLI's language-model presets).
    Raises ValueError for another `returns`, or "loss" without labels."""
    if returns not in RETURNS or (returns == "loss" and not labels):
        raise ValueError(f"returns={returns!r}: use one of {RETURNS} ('loss' needs labels=True: without labels "
                         "the model computes no loss)")
    if not labels:
        return model, (ids,)
    if returns == "loss":
        model.__class__ = loss_only(type(model))
    target = ids.clone()
    target[0, : max(1, ids.shape[1] // 4)] = -100
    return model, (ids,), {"labels": target}


@functools.cache
def loss_only(cls: type) -> type:
    """A subclass of a transformers model class whose forward returns the model output's `.loss` alone."""
    @functools.wraps(cls.forward)  # the parent's signature: export names the inputs by it (input_ids, labels)
    def forward(self, *args, **kwargs):
        return cls.forward(self, *args, **kwargs).loss

    forward.__doc__ = f"{cls.__name__}.forward(...).loss: the loss alone (`parallelizer.zoo.hf.loss_only`)."
    return type(f"{cls.__name__}LossOnly", (cls,), {"forward": forward, "__module__": __name__,
                                                      "__doc__": forward.__doc__})


def gpt2(batch: int = 2, seq_len: int = 32, device: str = "cpu", seed: int = 0, dropout: float = 0.0,
         labels: bool = False, returns: str = "all", **overrides):
    """transformers `GPT2LMHeadModel` (tied wte/lm_head); inputs: input_ids (batch, seq_len), and with
    `labels=True` keyword labels (batch, seq_len) so that the loss is computed inside the model
    (`returns="loss"`: the loss alone is returned, `_with_labels`)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    kw = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=max(64, seq_len),
              resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, use_cache=False,
              attn_implementation="eager", bos_token_id=0, eos_token_id=0)
    kw.update(overrides)
    model = _build(GPT2LMHeadModel, GPT2Config(**kw), device, seed)
    return _with_labels(model, _token_ids(batch, seq_len, kw["vocab_size"], device, seed), labels, returns)


def llama(batch: int = 2, seq_len: int = 32, device: str = "cpu", seed: int = 0, dropout: float = 0.0,
          labels: bool = False, returns: str = "all", **overrides):
    """transformers `LlamaForCausalLM` with grouped-query attention (4 query heads share 2 KV heads by
    default), RMSNorm and rotary embeddings; inputs: input_ids (batch, seq_len) [, labels=...]
    (`returns="loss"`: the loss alone is returned, `_with_labels`)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    kw = dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=256, max_position_embeddings=max(64, seq_len),
              attention_dropout=dropout, use_cache=False, attn_implementation="eager",
              bos_token_id=0, eos_token_id=0, pad_token_id=0)
    kw.update(overrides)
    model = _build(LlamaForCausalLM, LlamaConfig(**kw), device, seed)
    return _with_labels(model, _token_ids(batch, seq_len, kw["vocab_size"], device, seed), labels, returns)


def llama2_7b_config() -> dict:
    """Llama-2-7B shape (Touvron et al. 2023, Table 1 / the released config): hidden 4096, 32 layers,
    32 heads, intermediate 11008, vocab 32000."""
    return dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096)


def bert(batch: int = 2, seq_len: int = 32, device: str = "cpu", seed: int = 0, dropout: float = 0.0,
         **overrides):
    """transformers `BertModel`; inputs: input_ids (batch, seq_len)."""
    from transformers import BertConfig, BertModel

    kw = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
              vocab_size=256, max_position_embeddings=max(64, seq_len), hidden_dropout_prob=dropout,
              attention_probs_dropout_prob=dropout, attn_implementation="eager", pad_token_id=0)
    kw.update(overrides)
    model = _build(BertModel, BertConfig(**kw), device, seed)
    return model, (_token_ids(batch, seq_len, kw["vocab_size"], device, seed),)


def vit(batch: int = 2, device: str = "cpu", seed: int = 0, dropout: float = 0.0, **overrides):
    """transformers `ViTModel`; inputs: pixel_values (batch, num_channels, image_size, image_size)."""
    from transformers import ViTConfig, ViTModel

    kw = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
              image_size=32, patch_size=8, num_channels=3, hidden_dropout_prob=dropout,
              attention_probs_dropout_prob=dropout, attn_implementation="eager")
    kw.update(overrides)
    model = _build(ViTModel, ViTConfig(**kw), device, seed)
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randn(batch, kw["num_channels"], kw["image_size"], kw["image_size"], generator=gen)
    return model, (pixels.to(device),)
