P=/work/main/.venv/bin/python
timeout 550 $P trial/ckpt.py bert_cls '[{"pp":4},{"schedule":"1f1b","microbatches":4}]' '[{"pp":2,"dp":2},{"schedule":"bitpipe","microbatches":2}]' 2>&1 | grep -v Warn | tail -3 | cut -c1-1200
Q=/work/main/.venv/bin/parallelizer
$Q plan --model trial.factories:bert_cls --mesh pp=2,dp=2 --schedule gpipe --global-batch 8 --seq-len 16 -o /tmp/t4a_bert.json 2>&1 | tail -1
timeout 500 $Q rehearse /tmp/t4a_bert.json --nproc 4 --steps 2 2>&1 | grep -v Warn | tail -6
