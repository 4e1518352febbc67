"""Round 21 (r21b) host-state members as rehearsal builders (`build(name) -> (model, (x,))`, seeded), importable by
spawned ranks: each forward reads host state that a call changes (a generator object, a counter, a global, the
clock) or reseeds torch inside forward, which tracing freezes into the program."""
from __future__ import annotations

import random
import time

import numpy as np
import torch


class _Base(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)


class NpGen(_Base):
    """A mask from a numpy Generator held by the module."""

    def __init__(self) -> None:
        super().__init__()
        self.rng = np.random.default_rng(0)

    def forward(self, x):
        return torch.where(torch.tensor(self.rng.random(x.shape) < 0.5), 0.0, self.fc(x))


class NpRS(_Base):
    """A mask from a numpy RandomState held by the module."""

    def __init__(self) -> None:
        super().__init__()
        self.rng = np.random.RandomState(0)

    def forward(self, x):
        return torch.where(torch.tensor(self.rng.rand(*x.shape) < 0.5), 0.0, self.fc(x))


class PyRand(_Base):
    """A scale from a random.Random held by the module."""

    def __init__(self) -> None:
        super().__init__()
        self.rng = random.Random(0)

    def forward(self, x):
        return self.fc(x) * self.rng.random()


class Counter(_Base):
    """A warm-up scale read from a step counter forward advances."""

    def __init__(self) -> None:
        super().__init__()
        self.step, self.warmup = 0, 3

    def forward(self, x):
        self.step += 1
        return self.fc(x) * min(1.0, self.step / self.warmup)


CALLS = 0


class GlobalCounter(_Base):
    """A branch on a module-level call counter."""

    def forward(self, x):
        global CALLS
        CALLS += 1
        return self.fc(x) * (0.5 if CALLS > 1 else 1.0)


class Clock(_Base):
    """A scale read from the clock."""

    def forward(self, x):
        return self.fc(x) * (1.0 + time.time() % 1.0)


class Seed(_Base):
    """torch.manual_seed inside forward before a dropout."""

    def forward(self, x):
        torch.manual_seed(0)
        return torch.nn.functional.dropout(self.fc(x), 0.5)


MEMBERS = ("NpGen", "NpRS", "PyRand", "Counter", "GlobalCounter", "Clock", "Seed")


def build(name: str):
    torch.manual_seed(0)
    return globals()[name](), (torch.randn(8, 8),)
