# Two entry points (README): `make demo` runs the main job, `make test` runs the whole test suite.
# Both create .venv when missing and install torch==2.13.0 (CPU wheel on this machine) before the package.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test test-long bench notebooks fuzz sweep longrun setup clean
N ?= 300
SEED ?= 0

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m parallelizer.demo

# Two pytest workers, one test file each at a time (module fixtures launch ranks once): the suite uses about
# 1.4 of this machine's 2 cores when run serially. Files are handed out in collection order, the longest first
# (tests/conftest.py LONG_FIRST), not xdist's default by test count, which left the long one-test files last.
# Tests marked `long` (pytest -m long) run in `make test-long`: each one's class keeps a cheaper test in `make test`
# (benchmarks/RESULTS.md, rounds 19 (r19a) and 25 (r25a), list them and the test that keeps each class).
# --durations=25: every run (CI, a fresh clone) ends with its 25 longest set-ups / tests, so where the time goes
# (and whether LONG_FIRST still puts the long files first) is on record without a second run.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not long" --durations=25

test-long: $(STAMP)
	$(PY) -m pytest -q -m long

fuzz: $(STAMP)
	$(PY) tests/fuzz/run_fuzz.py --n $(N) --seed $(SEED) --results-md benchmarks/RESULTS.md

# torch.nn layers, losses and linalg/special/fft/distributions ops on 5 plans each (1-2 h): JSON lines
sweep: $(STAMP)
	$(PY) tests/fuzz/nn_sweep.py benchmarks/nn_sweep.jsonl

# Long runs (200 steps): plans' loss / gradient-norm / eval curves and final states against one device in float32
# and float64 (`benchmarks/bench_long_runs.py`; ~30 min on this machine); STEPS=, ONLY="name ..." to narrow
STEPS ?= 200
longrun: $(STAMP)
	$(PY) -m benchmarks.bench_long_runs --steps $(STEPS) --json benchmarks/long_runs.json $(if $(ONLY),--only $(ONLY),)

bench: $(STAMP)
	$(PY) -m benchmarks.run_all

notebooks: $(STAMP)
	$(PY) notebooks/execute.py

clean:
	rm -rf $(VENV) build *.egg-info
