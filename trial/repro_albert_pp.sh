#!/bin/sh
# Untyped crash (before 'blocks: interleaved instances'): transformers' ALBERT (one layer called 4 times) on a
# pipeline mesh. Block detection took the shared layer's sibling Linears (query/key/value/dense) for a group of
# 4 blocks and the stage cutter failed with a raw KeyError 'layer_norm_2' in runtime/pipeline.py stage_graph.
# Now: PipelineError "one block ... called 4 times with shared weights ... Remedy: a mesh without 'pp'".
cd "$(dirname "$0")/.." && PYTHONPATH=$PWD HF_HUB_OFFLINE=1 python -m parallelizer plan --model trial.ppf:albert \
    --mesh pp=2,dp=2 --global-batch 8 --seq-len 12 -o /tmp/pp_albert.json --no-progress --time-limit 20
