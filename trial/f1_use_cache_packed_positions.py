"""Finding (round 10a): transformers Llama with its default config (use_cache=True) fed position_ids and no
attention_mask (packed sequences, DataCollatorWithFlattening-style, or any position_ids whose diff != 1):
the eager model keeps a DynamicCache, so transformers' masking_utils skips packed-sequence detection
(`packed_sequence_mask` only when `cache is None`), while parallelizer.trace sets config.use_cache=False
while tracing (tracer/trace.py, `_cache_off`), so the traced graph DOES apply the packed-sequence mask.
The ParallelModule trains another model than the user's single-device script, on every mesh (ddp, tp, ...).
One process is enough: auto_parallelize without a launcher runs on one device.
Run: PYTHONPATH=$PWD python trial/f1_use_cache_packed_positions.py"""
import copy

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import parallelizer

if __name__ == "__main__":
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, attn_implementation="eager")  # use_cache=True
    model = LlamaForCausalLM(cfg)
    ref = copy.deepcopy(model)
    ids = torch.randint(0, 128, (4, 8), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(8).repeat(4, 1)
    pos[1] = torch.tensor([0, 1, 2, 0, 1, 2, 3, 4])  # row 1 packs two sequences (3 + 5 tokens)
    labels = ids.clone()
    pm = parallelizer.auto_parallelize(model, (), example_kwargs=dict(input_ids=ids, position_ids=pos, labels=labels))
    a = pm(input_ids=ids, position_ids=pos, labels=labels)
    b = ref(input_ids=ids, position_ids=pos, labels=labels)
    print("per-row max |pm - eager| logits:", [f"{(a.logits[i] - b.logits[i]).abs().max().item():.3g}" for i in range(4)])
    print("loss pm", a.loss.item(), "eager", b.loss.item())
    ref.config.use_cache = False
    c = ref(input_ids=ids, position_ids=pos, labels=labels)
    print("eager with use_cache=False vs pm, row 1:", (a.logits[1] - c.logits[1]).abs().max().item())
