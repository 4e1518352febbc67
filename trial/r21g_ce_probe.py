"""r21g probe: is the causal-LM cross-entropy planned vocab-parallel on a tp axis (README section 2: "the loss is
computed in the graph (vocab-parallel) and no logits are gathered")? Llama vs GPT-2, 2 layers, width 1024,
vocab 32000, batch 8 x 1024 on meta, planned for h100:1x8 on dp=2 x tp=4, with and without roles.

    PYTHONPATH=. python trial/r21g_ce_probe.py
"""
from __future__ import annotations

import warnings

import torch

import parallelizer
from parallelizer import zoo


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=8, tie_word_embeddings=False, use_cache=False)
    with torch.device("meta"):
        m = LlamaForCausalLM(cfg)
    ids = torch.zeros(8, 1024, dtype=torch.long, device="meta")
    return m, (ids,), {"labels": ids.clone()}


def gpt2():
    return zoo.gpt2(n_layer=2, n_embd=1024, n_head=8, vocab_size=32000, batch=8, seq_len=1024, labels=True,
                    returns="loss", device="meta")


def main() -> None:
    warnings.simplefilter("ignore")
    for name, fn in (("llama", llama), ("gpt2", gpt2)):
        model, args, kwargs = fn()
        traced = parallelizer.trace(model, args, kwargs)
        for roles in (None, {"dp": "fsdp", "tp": "tp"}):
            plan = parallelizer.plan(traced, {"dp": 2, "tp": 4}, cluster="h100:1x8", axis_roles=roles,
                                     time_limit_s=120)
            ce = [n for n in plan.nodes if "cross_entropy" in n]
            lay = {n: str(plan.nodes[n]) for n in ce}
            print(f"{name} roles={roles}: step {plan.cost.total_s * 1e3 if hasattr(plan, 'cost') else '?'} ms; {lay}")
            print("   ", [l for l in plan.summary().splitlines() if l.startswith("solver")][0][:160])
            for note in plan.notes():
                if "gather" in note:
                    print("   NOTE", note[:300])
            if ce:
                print("   explain:", str(parallelizer.explain(traced, plan, ce[0]))[:2500].replace("\n", "\n     "))


if __name__ == "__main__":
    main()
