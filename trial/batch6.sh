P=/work/main/.venv/bin/python
r() { timeout 400 $P trial/harness.py "$@" 2>&1 | grep -v "Warning: \|warnings.warn" | tail -3 | cut -c1-700; }
r gemma2 '{"pp":2,"tp":2}' '{"schedule":"zbv","microbatches":4,"axis_roles":{"tp":"tp"}}'
r llama_pos1 '{"dp":2,"tp":2}' '{"axis_roles":{"dp":"ddp","tp":"tp"}}'
r qwen2moe '{"pp":2,"dp":2}' '{"schedule":"dualpipev","microbatches":4}'
r mixtral_aux '{"dp":4}' '{"axis_roles":{"dp":"ddp"}}'
