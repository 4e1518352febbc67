"""The models the published step-time comparisons trace, built on `meta` with the loss computed inside and returned
alone, as Megatron-LM's and the Llama 3 trainer's last pipeline stage does (and torchtitan's step,
`steptime_torchtitan.LossOnly`). A traced model that returns its logits has them returned whole over dp and tp by
our last stage (`runtime.stage_cut.step_returns`, priced since round 16): e.g. one microbatch of (1, 4096, 131072)
bf16 logits x dp 48 = 51.5 GB on the Megatron H100 1.7B row, which made it and the 7.1B row infeasible (round 18).
"""
import torch
import parallelizer
from parallelizer.zoo import hf


def gpt_loss_only(layers: int, hidden: int, heads: int, vocab: int, seq: int, attn: str, **overrides):
    """transformers GPT-2 (Megatron's GPT: tied head, GeLU MLP 4h) of batch 1 x `seq` in bf16, traced returning its
    causal-LM loss alone (`zoo.hf.gpt2(labels=True, returns="loss")`)."""
    model, args, kwargs = hf.gpt2(1, seq, device="meta", labels=True, returns="loss", n_layer=layers, n_embd=hidden,
                                  n_head=heads, vocab_size=vocab, n_positions=seq, attn_implementation=attn, **overrides)
    return parallelizer.trace(model.to(torch.bfloat16), args, kwargs)


def llama_loss_only(layers: int, hidden: int, ffn: int, heads: int, kv_heads: int, vocab: int, seq: int):
    """transformers Llama (GQA, SwiGLU, untied head, SDPA) of batch 1 x `seq` in bf16, traced returning its causal-LM
    loss alone (`zoo.hf.llama(labels=True, returns="loss")`)."""
    model, args, kwargs = hf.llama(1, seq, device="meta", labels=True, returns="loss", hidden_size=hidden,
                                   intermediate_size=ffn, num_hidden_layers=layers, num_attention_heads=heads,
                                   num_key_value_heads=kv_heads, vocab_size=vocab, max_position_embeddings=seq,
                                   attn_implementation="sdpa")
    return parallelizer.trace(model.to(torch.bfloat16), args, kwargs)
