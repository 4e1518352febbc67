P=/work/main/.venv/bin/python
r() { timeout 400 $P trial/harness.py "$@" 2>&1 | grep -v "Warning: \|warnings.warn" | tail -4 | cut -c1-900; }
r llama_pos1 '{"pp":2,"dp":2}' '{"schedule":"1f1b"}'
r llama_nitems '{"pp":2,"dp":2}' '{"schedule":"1f1b"}'
r llama_nitems_t '{"pp":2,"dp":2}' '{"schedule":"1f1b"}'
$P trial/batch2.py mixtral_aux_remedy 2>&1 | grep -i "warn\|mixtral_aux" | cut -c1-600 | head -5
