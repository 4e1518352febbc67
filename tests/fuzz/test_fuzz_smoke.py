"""A 10-case smoke run of the random-model fuzzer inside `make test` (the full sweep is `make fuzz`), and the
seeds earlier sweeps found failing, kept as regression cases."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_fuzz  # noqa: E402

pytestmark = pytest.mark.distributed
REGRESSIONS: list[int] = []  # case seeds that once failed (see the issue notes); each must now match


def test_fuzz_smoke_10_cases_match_one_device():
    seeds = [7_000_000 + i for i in range(10)] + REGRESSIONS
    results = run_fuzz.run(seeds, chunk=len(seeds))  # one launch of ranks per world size
    bad = [r for r in results if r["status"] != "match"]
    assert not bad, "\n".join(map(str, bad))
