"""CLI factories for pipeline plans of the trial5b decoder-only families:
parallelizer plan --model trial.cli5b:<family> --mesh pp=2,dp=2 --global-batch 8 --seq-len 8 -o p.json"""
import torch

from trial import hf5b


def _factory(family):
    def factory(batch=8, seq_len=8, **kw):
        hf5b.B, hf5b.T = batch, seq_len
        model, args, kwargs = hf5b.build(family)
        return model, args, kwargs
    factory.__name__ = family
    return factory


for _f in ["deepseek_v3", "deepseek_v2", "gemma3", "llama4", "jamba", "zamba2", "mamba2", "falcon_mamba",
           "recurrent_gemma", "nemotron", "phimoe", "glm", "glm4", "exaone4", "helium", "bamba", "cohere2", "gpt_oss",
           "qwen3_next", "smollm3", "dots1", "deepseek_v3_moe"]:
    globals()[_f] = _factory(_f)


def modernbert_uneven(batch=8, seq_len=8, **kw):
    """ModernBERT MLM with an attention mask (padding) and labels whose non-ignored counts differ per row."""
    hf5b.B, hf5b.T = batch, seq_len
    model, args, kwargs = hf5b.build("modernbert")
    ids = args[0]
    mask = torch.ones(batch, seq_len, dtype=torch.long)
    labels = torch.full((batch, seq_len), -100)
    for r in range(batch):
        mask[r, seq_len - (r % 4):] = 0
        labels[r, 1:2 + r] = ids[r, 1:2 + r]
    labels[labels.ne(-100) & mask.eq(0)] = -100
    return model, (ids,), {"attention_mask": mask, "labels": labels}
