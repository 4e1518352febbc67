"""Round 21 (r21b) host-state members (`tests/unit/test_host_state_frozen.py`'s models: a generator object, a
counter, a global, the clock held or read by forward, or torch.manual_seed inside it, which tracing freezes into
the program) as rehearsal builders, `build(name) -> (model, (x,))`, seeded and importable by spawned ranks."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
import test_host_state_frozen as members  # noqa: E402

MEMBERS = ("NumpyGenerator", "NumpyRandomState", "PythonRandom", "WarmupCounter", "GlobalCounter", "Clock",
           "Reseeding")


def build(name: str):
    """A fresh member `name` (a class of `members`) and an input (8, 8), after torch.manual_seed(0)."""
    torch.manual_seed(0)
    return getattr(members, name)(), (torch.randn(8, 8),)
