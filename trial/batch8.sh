P=/work/main/.venv/bin/python
r() { timeout 400 $P trial/harness.py "$@" 2>&1 | grep -v "Warning: \|warnings.warn" | tail -3 | cut -c1-700; }
r bert_reg '{"pp":2,"tp":2}' '{"schedule":"1f1b","axis_roles":{"tp":"tp"}}'
$P trial/batch2.py sq_mean 2>&1 | grep -v "Warning: \|warnings.warn" | tail -2 | cut -c1-700
