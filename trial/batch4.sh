P=/work/main/.venv/bin/python
$P trial/batch2.py mixtral_aux_remedy fn_itemcount_ok 2>&1 | grep -v Warn | cut -c1-700
r() { timeout 400 $P trial/harness.py "$@" 2>&1 | grep -v Warning | tail -4 | cut -c1-700; }
r gemma2 '{"pp":2,"dp":2}' '{"schedule":"zbv","microbatches":4}'
r t5 '{"pp":2,"dp":2}' '{}'
r llama_gqa_kw '{"pp":2,"tp":2}' '{"schedule":"interleaved_1f1b","microbatches":2,"axis_roles":{"tp":"tp"}}'
