"""Host state a training forward reads and changes is refused at trace (round 21, r21b; `tracer.host_state`).

torch.export runs forward once and keeps what it computed on the host as constants, so every step of the traced
and of the parallel program repeats the first call's value while the model computes a new one per call. Round 20
refused draws from numpy's and Python's GLOBAL generators; these members traced with at most a note, and trained
other numbers than one device without an error (figures: benchmarks/RESULTS.md, Round 21 (r21b)):
- draws through generator objects: `np.random.default_rng(0)`, `np.random.RandomState(0)`, `random.Random(0)`
  held by a module or a global;
- counters forward advances (an attribute, a global, a closure cell) read by a warm-up scale or a branch;
- the clock (`time.time()`);
- `torch.manual_seed` inside forward (export drops it: the program draws new masks per step, the model reseeds).
Each is now a TraceError in training mode naming the state and the remedies; `allow_frozen_host_random=True`
traces with a note, as in eval mode. Host values that do not change between calls (config reads, shapes,
`os.environ`, a generator seeded inside forward, a counter forward never reads) still trace without an error,
A `torch.Generator` object passed to a draw (`generator=g`) stopped the planner with a bare StopIteration (export
lifts it as an opaque input): now a TraceError naming it. Tracing leaves the counters and generators as they were.
Every refusal test fails on main 5d40a3e.
"""
import os
import random
import time

import numpy as np
import pytest
import torch

import parallelizer
from parallelizer import TraceError


class _Base(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)


class NumpyGenerator(_Base):
    """A SpecAugment-like mask drawn from a numpy Generator object. x: (B, 8) -> (B, 8)."""

    def __init__(self) -> None:
        super().__init__()
        self.rng = np.random.default_rng(0)

    def forward(self, x):
        return torch.where(torch.tensor(self.rng.random(x.shape) < 0.5), 0.0, self.fc(x))


class NumpyRandomState(_Base):
    def __init__(self) -> None:
        super().__init__()
        self.rng = np.random.RandomState(0)

    def forward(self, x):
        return torch.where(torch.tensor(self.rng.rand(*x.shape) < 0.5), 0.0, self.fc(x))


class PythonRandom(_Base):
    def __init__(self) -> None:
        super().__init__()
        self.rng = random.Random(0)

    def forward(self, x):
        return self.fc(x) * self.rng.random()


GLOBAL_RNG = np.random.default_rng(1)


class GlobalGenerator(_Base):
    def forward(self, x):
        return self.fc(x) * float(GLOBAL_RNG.random())


class WarmupCounter(_Base):
    """A warm-up inside forward: scale step / warmup, step advanced per call (0.33, 0.67, 1.0, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.step, self.warmup = 0, 3

    def forward(self, x):
        self.step += 1
        return self.fc(x) * min(1.0, self.step / self.warmup)


CALLS = 0


class GlobalCounter(_Base):
    """A curriculum switch on a global counter: the first call takes one branch, every later call the other."""

    def forward(self, x):
        global CALLS
        CALLS += 1
        return self.fc(x) * (0.5 if CALLS > 1 else 1.0)


def _closure_counter():
    count = 0

    class ClosureCounter(_Base):
        def forward(self, x):
            nonlocal count
            count += 1
            return self.fc(x) / count
    return ClosureCounter


ClosureCounter = _closure_counter()


class Clock(_Base):
    def forward(self, x):
        return self.fc(x) * (1.0 + time.time() % 1.0)


_NUMPY = "numpy.random._generator.Generator"


@pytest.mark.parametrize("cls, named", [
    (NumpyGenerator, f"attribute 'rng' of the root module (NumpyGenerator) ({_NUMPY}) advanced"),
    (NumpyRandomState, "attribute 'rng' of the root module (NumpyRandomState) (numpy.random.mtrand.RandomState) "
                       "advanced"),
    (PythonRandom, "attribute 'rng' of the root module (PythonRandom) (random.Random) advanced"),
    (GlobalGenerator, f"global 'GLOBAL_RNG' of {__name__} ({_NUMPY}) advanced"),
    (WarmupCounter, "attribute 'step' of the root module (WarmupCounter): 0 -> 1"),
    (GlobalCounter, f"global 'CALLS' of {__name__}: 0 -> 1"),
    (ClosureCounter, "closure variable 'count' of _closure_counter.<locals>.ClosureCounter.forward: 0 -> 1"),
    (Clock, "nothing the tracer could name (a value the call reads and changes elsewhere: the clock"),
])
def test_host_state_changed_by_a_training_forward_is_refused_naming_it(cls, named):
    global CALLS
    CALLS = 0
    torch.manual_seed(0)
    model, x = cls(), torch.randn(4, 8)
    holder = getattr(model, "rng", None) or (GLOBAL_RNG if cls is GlobalGenerator else None)
    state = holder.bit_generator.state if hasattr(holder, "bit_generator") else (
        holder.get_state()[1].copy() if hasattr(holder, "get_state") else holder.getstate() if holder else None)
    with pytest.raises(TraceError, match="reads host state it changes") as info:
        parallelizer.trace(model, (x,))
    message = str(info.value)
    assert named in message, message
    assert "register_buffer" in message and "allow_frozen_host_random=True" in message
    # tracing leaves the host state as it found it
    assert getattr(model, "step", 0) == 0 and CALLS == 0 and ClosureCounter.forward.__closure__[0].cell_contents == 0
    if holder is not None:
        after = holder.bit_generator.state if hasattr(holder, "bit_generator") else (
            holder.get_state()[1] if hasattr(holder, "get_state") else holder.getstate())
        assert (after == state).all() if isinstance(state, np.ndarray) else after == state
    with pytest.warns(UserWarning, match="repeats them at every step"):
        traced = parallelizer.trace(model, (x,), allow_frozen_host_random=True)
    assert any(named in note for note in traced.notes)
    CALLS = 0


def test_the_same_host_state_in_eval_mode_is_noted_not_refused():
    model = WarmupCounter().eval()
    with pytest.warns(UserWarning, match="attribute 'step' of the root module"):
        traced = parallelizer.trace(model, (torch.randn(4, 8),))
    assert any("two eager calls of forward" in note for note in traced.notes) and model.step == 0


class Reseeding(_Base):
    def forward(self, x):
        torch.manual_seed(0)
        return torch.nn.functional.dropout(self.fc(x), 0.5)


class ReseedingWithoutDraws(_Base):
    def forward(self, x):
        torch.manual_seed(0)
        return self.fc(x)


def test_torch_manual_seed_in_a_training_forward_that_draws_is_refused():
    """export drops the reseed: the program draws a new dropout mask per step, the model the same one."""
    with pytest.raises(TraceError, match=r"torch.manual_seed .* inside forward at .*test_host_state_frozen.py:\d+"):
        parallelizer.trace(Reseeding(), (torch.randn(4, 8),))
    with pytest.warns(UserWarning, match="forward reseeds torch's generator"):
        parallelizer.trace(Reseeding(), (torch.randn(4, 8),), allow_frozen_host_random=True)
    with pytest.warns(UserWarning, match="forward reseeds torch's generator"):  # nothing drawn: no difference
        parallelizer.trace(ReseedingWithoutDraws(), (torch.randn(4, 8),))


class Constant(_Base):
    """Host values that do not change between calls: a config field, a shape, an environment variable, a
    generator seeded in forward, a counter forward never reads."""

    def __init__(self) -> None:
        super().__init__()
        self.config = type("Config", (), {"scale": 0.5})()
        self.calls = 0

    def forward(self, x):
        self.calls += 1  # bookkeeping only
        scale = self.config.scale * x.shape[-1] / 8 * float(os.environ.get("R21B_SCALE", "1"))
        noise = torch.tensor(np.random.default_rng(3).random(x.shape), dtype=x.dtype)
        return self.fc(x) * scale + noise


def test_host_values_constant_between_calls_trace_without_error():
    model = Constant()
    traced = parallelizer.trace(model, (torch.randn(4, 8),))
    assert not any("two eager calls" in note for note in traced.notes), traced.notes
    assert model.calls == 0


class Tempered(_Base):
    """Gumbel-softmax-like tau annealing: the training loop lowers the root's `temperature` between steps."""

    def __init__(self) -> None:
        super().__init__()
        self.temperature = 1.0

    def forward(self, x):
        return torch.softmax(self.fc(x) / self.temperature, -1)


def test_a_root_setting_changed_between_steps_is_traced_with_its_new_value():
    """`pm.temperature = t` after auto_parallelize: before, it set an attribute nothing read (the root model's
    settings were not mirrored), so every step kept the traced 1.0 (dp=2 over 3 AdamW steps: ratio 1.6e4). Now the
    ParallelModule holds the root's settings and a change selects a program traced with it, as a submodule's does;
    3 AdamW steps with the temperature lowered at the second match one device."""
    torch.manual_seed(0)
    model, x = Tempered(), torch.randn(4, 8)
    reference = Tempered()
    reference.load_state_dict(model.state_dict())
    pm = parallelizer.auto_parallelize(model, (x,), cluster="h100:1x1")
    weights = torch.arange(8.0)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=0.05) for m in (pm, reference)]
    for step in range(3):
        if step == 1:
            pm.temperature = reference.temperature = 0.25
        losses = []
        for m, optimizer in zip((pm, reference), optimizers):
            loss = (m(x) * weights).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[0], losses[1])
    torch.testing.assert_close(dict(pm.named_parameters())["fc.weight"], reference.fc.weight)
    with pm.full_model() as full:
        assert full.temperature == 0.25
        full.temperature = 0.5
    assert pm.temperature == 0.5


class HeldTorchGenerator(_Base):
    def __init__(self) -> None:
        super().__init__()
        self.gen = torch.Generator().manual_seed(0)

    def forward(self, x):
        return self.fc(x) + torch.randn(x.shape, generator=self.gen)


def test_a_torch_generator_object_in_forward_is_a_trace_error_not_a_planner_stop():
    """Before: trace passed and parallelizer.plan / auto_parallelize raised a bare StopIteration."""
    with pytest.raises(TraceError, match=r"torch.Generator object .*model.gen\).*\n.*aten.randn.generator"):
        parallelizer.trace(HeldTorchGenerator(), (torch.randn(4, 8),))


class PythonSeeded(_Base):
    def forward(self, x):
        random.seed(0)
        return self.fc(x) * random.random()


class NumpySeeded(_Base):
    def forward(self, x):
        np.random.seed(0)
        return self.fc(x) * float(np.random.rand())


class DrawThenSeed(_Base):
    def forward(self, x):
        scale = random.random()  # a new value per call: frozen by tracing
        random.seed(0)
        return self.fc(x) * scale * random.random()


@pytest.mark.parametrize("cls", [PythonSeeded, NumpySeeded])
def test_a_draw_after_a_fixed_seed_in_forward_traces(cls):
    """The same value at every call, which the program repeats: exact (refused before, round 20's check judged
    the moved global state). From other global states than the one forward's seed leaves (from that one the
    state does not move)."""
    random.seed(123)
    np.random.seed(123)
    with pytest.warns(UserWarning, match="forward drew random numbers"):
        parallelizer.trace(cls(), (torch.randn(4, 8),))


def test_a_draw_before_the_seed_is_still_refused():
    """(From another global state than the one forward's seed leaves: from that one the first draw repeats too.)"""
    random.seed(123)
    with pytest.raises(TraceError, match="random numbers drawn from numpy's or Python's generator in training"):
        parallelizer.trace(DrawThenSeed(), (torch.randn(4, 8),))
