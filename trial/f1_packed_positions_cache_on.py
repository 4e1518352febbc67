"""Packed sequences (position_ids restarting in a row, no attention_mask) on a use_cache=True config: the traced
program must compute what the user's model computes (it masked across packed rows when tracing flipped use_cache)."""
import torch
import parallelizer
from parallelizer.zoo import families

if __name__ == "__main__":
    model, args, kwargs = families.llama()
    ids = args[0]
    pos = torch.arange(ids.shape[1]).repeat(ids.shape[0], 1)
    pos[0, 3:] -= 3
    call = {"input_ids": ids, "position_ids": pos}
    traced = parallelizer.trace(model, (), call)
    got = traced.exported.module()(**call).logits
    want = model(**call).logits
    print("max |traced - eager| =", (got - want).abs().max().item())
    print([n for n in traced.notes if "cache" in n])
