#!/bin/bash
# ./trial/r21g_run.sh NAME ARGS... : one 4-rank torchrun launch of r21g_train.py (log in /tmp/r21g/logs/NAME.log)
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
mkdir -p /tmp/r21g/logs
name=$1; shift
uptime > /tmp/r21g/logs/$name.load
/usr/bin/time -v timeout 900 /work/main/.venv/bin/torchrun --nproc-per-node 4 --master-port $((29500 + RANDOM % 500)) \
    trial/r21g_train.py --out /tmp/r21g/$name.json "$@" > /tmp/r21g/logs/$name.log 2>&1
echo "rc=$?" >> /tmp/r21g/logs/$name.log
uptime >> /tmp/r21g/logs/$name.load
