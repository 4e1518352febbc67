"""The main job (`make demo`): trace the embedded default model and print what the toolkit sees.

The default model is the GPT-2 small architecture (12 layers, hidden 768, 12 heads, vocab 50257, sequence
1024; Radford et al. 2019) built from its config with random weights on the `meta` device, so nothing is
downloaded or allocated.
"""
from __future__ import annotations

import time

from . import trace, zoo

GPT2_SMALL = dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)


def main() -> None:
    """Trace GPT-2 small (batch 8 x seq 1024, meta device) and print the TracedGraph summary."""
    model, inputs = zoo.gpt2(batch=8, seq_len=1024, device="meta", **GPT2_SMALL)
    start = time.perf_counter()
    traced = trace(model, inputs)
    print(f"traced GPT-2 small (batch 8 x seq 1024, meta device) in {time.perf_counter() - start:.1f} s")
    print(traced.summary())


if __name__ == "__main__":
    main()
