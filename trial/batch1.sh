P=/work/main/.venv/bin/python
r() { timeout 400 $P trial/harness.py "$@" 2>&1 | grep -v Warning | tail -8; }
r roberta_cls '{"pp":2,"tp":2}' '{"schedule":"1f1b","axis_roles":{"tp":"tp"}}'
r llama_gqa_kw '{"pp":2,"dp":2}' '{"schedule":"1f1b"}'
r llama_gqa_kw '{"pp":4}' '{"schedule":"interleaved_1f1b","microbatches":4}'
r mixtral '{"pp":2,"tp":2}' '{"schedule":"1f1b","axis_roles":{"tp":"tp"}}'
r mixtral_aux '{"pp":2,"dp":2}' '{"schedule":"gpipe"}'
r qwen2moe_aux '{"pp":2,"dp":2}' '{"schedule":"1f1b"}'
r gemma2 '{"pp":2,"dp":2}' '{"schedule":"zbv"}'
r gemma2 '{"pp":4}' '{"schedule":"dualpipev","microbatches":4}'
r t5 '{"pp":2,"dp":2}' '{}'
r bart '{"pp":2,"dp":2}' '{}'
r bert_cls '{"pp":2,"dp":2}' '{"schedule":"bitpipe","microbatches":2}'
