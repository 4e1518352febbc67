P=/work/main/.venv/bin/python
c() { timeout 550 $P trial/ckpt.py "$@" 2>&1 | grep -v Warn | tail -6 | cut -c1-1500; }
c mixtral '[{"pp":2,"dp":2},{"schedule":"gpipe"}]' '[{"dp":2,"tp":2},{"axis_roles":{"tp":"tp"}}]'
c bert_cls '[{"pp":4},{"schedule":"1f1b","microbatches":4}]' '[{"dp":4},{}]'
c gemma2 '[{"dp":2,"tp":2},{"axis_roles":{"dp":"fsdp","tp":"tp"}}]' '[{"pp":2,"dp":2},{"schedule":"1f1b"}]'
