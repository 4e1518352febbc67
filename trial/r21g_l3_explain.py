"""r21g: why the Llama-3-8B plan of `parallelizer plan ... --mesh dp=2,tp=4 --roles dp=fsdp,tp=tp` (written by
/tmp/r21g/cli/run_cli.sh) gathers the logits over tp before the cross-entropy instead of running it vocab-parallel.

    PYTHONPATH=. python trial/r21g_l3_explain.py /tmp/r21g/cli/l3_fsdp2tp4.json
"""
from __future__ import annotations

import sys
import warnings

import parallelizer
from parallelizer import zoo
from parallelizer.planner.plan import Plan

L3 = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
          num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192)


def main() -> None:
    warnings.simplefilter("ignore")
    path = sys.argv[1]
    model, args, kwargs = zoo.llama(batch=16, seq_len=8192, labels=True, returns="loss", device="meta",
                                   attn_implementation="sdpa", **L3)  # as the plan JSON's recipe records
    traced = parallelizer.trace(model, args, kwargs)
    plan = Plan.load(path, traced=traced)
    print(parallelizer.explain(traced, plan, "cross_entropy_loss", cluster="h100:1x8"))


if __name__ == "__main__":
    main()
