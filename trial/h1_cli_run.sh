#!/bin/bash
# trial h1: CLI pp=2 x dp=2 plans of decoder LMs, rehearsed on 4 gloo ranks
cd /work/wt-trial9a
export PYTHONPATH=$PWD:$PWD/trial HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1
for m in "$@"; do
  t=$(date +%s)
  /work/main/.venv/bin/parallelizer plan --model h1_cli:$m --mesh pp=2,dp=2 --global-batch 8 --seq-len 8 -o /tmp/h1_pp_$m.json > /tmp/h1_pp_$m.plan.log 2>&1
  echo "$m plan rc=$? $(( $(date +%s)-t ))s"; tail -3 /tmp/h1_pp_$m.plan.log | cut -c1-300
  t=$(date +%s)
  timeout 600 /work/main/.venv/bin/parallelizer rehearse /tmp/h1_pp_$m.json --nproc 4 > /tmp/h1_pp_$m.reh.log 2>&1
  echo "$m rehearse rc=$? $(( $(date +%s)-t ))s"; grep -v "Warn\|warn" /tmp/h1_pp_$m.reh.log | tail -4 | cut -c1-600
done
