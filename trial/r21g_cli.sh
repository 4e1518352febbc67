#!/bin/bash
# r21g: the CLI as a reviewer uses it (re-runnable; writes to /tmp/r21g/cli).
#   ./trial/r21g_cli.sh llama3   # three Llama-3-8B plans (h100:1x8 dp=2,tp=4 without / with roles; h100:4x8 searched) + show
#   ./trial/r21g_cli.sh cpu      # calibrate this machine (4 ranks, --quick), then plan the trial's Llama on it (searched)
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH=$PWD:$PWD/trial HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
P=/work/main/.venv/bin/parallelizer
O=/tmp/r21g/cli; mkdir -p $O
CFG=hidden_size=4096,intermediate_size=14336,num_hidden_layers=32,num_attention_heads=32,num_key_value_heads=8,vocab_size=128256,rope_theta=500000.0,max_position_embeddings=8192
if [ "$1" = llama3 ]; then
  $P plan --model llama --config $CFG --cluster h100:1x8 --mesh dp=2,tp=4 --global-batch 16 --seq-len 8192 --no-progress -o $O/l3_dp2tp4.json > $O/l3_dp2tp4.log 2>&1
  $P plan --model llama --config $CFG --cluster h100:1x8 --mesh dp=2,tp=4 --roles dp=fsdp,tp=tp --global-batch 16 --seq-len 8192 --no-progress -o $O/l3_fsdp2tp4.json > $O/l3_fsdp2tp4.log 2>&1
  $P plan --model llama --config $CFG --cluster h100:4x8 --global-batch 128 --seq-len 8192 --no-progress -o $O/l3_search32.json > $O/l3_search32.log 2>&1
  for n in l3_dp2tp4 l3_fsdp2tp4 l3_search32; do $P show $O/$n.json > $O/show_$n.txt 2>&1; done
elif [ "$1" = cpu ]; then
  $P calibrate -o $O/profile.json --quick --nprocs 4 > $O/calib.log 2>&1
  $P plan --model r21g_train:factory --cluster $O/profile.json --global-batch 8 --seq-len 32 --time-limit 60 --no-progress -o $O/cpu_plan.json > $O/cpu_plan.log 2>&1
  $P show $O/cpu_plan.json > $O/show_cpu_plan.txt 2>&1
  echo "then: ./trial/r21g_run.sh file --mode file --plan $O/cpu_plan.json --steps 6"
else
  echo "usage: $0 llama3|cpu"; exit 2
fi
