"""The tracer compares the exported program with the model's eager forward once (`tracer.eager_check`):
model code that takes another path under torch.export (trial 10b: transformers' PaliGemma, default config,
logits 7e-2 apart on one device; every sharded program computes the exported function) is warned about
and noted, with the size of the difference; a model that computes the same gets no note; what one call
cannot decide is skipped with a note; the model's buffers and torch's RNG state are left as they were."""
import warnings

import pytest
import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutputWithPooling

import parallelizer
from parallelizer.tracer import eager_check


class Branchy(nn.Module):
    """Scales by 2 eagerly and by 3 under torch.export (the class: an is_compiling() branch)."""

    def __init__(self, branch: bool = True) -> None:
        super().__init__()
        self.lin, self.bn, self.branch = nn.Linear(8, 8), nn.BatchNorm1d(8), branch

    def forward(self, x):
        h = self.bn(self.lin(x))
        return h * (3.0 if self.branch and torch.compiler.is_compiling() else 2.0)


def _trace(model, x):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = parallelizer.trace(model, (x,))
    return traced, [str(w.message) for w in caught]


def test_a_model_that_computes_otherwise_under_export_is_warned_about_with_the_difference():
    torch.manual_seed(0)
    model, x = Branchy(), torch.randn(4, 8)
    eager = model(x).detach()  # (its own BatchNorm update; the trace below must not add one)
    stats = model.bn.running_mean.clone(), model.bn.num_batches_tracked.clone()
    rng = torch.get_rng_state()
    traced, caught = _trace(model, x)
    notes = [n for n in traced.notes if n.startswith("the exported program differs")]
    assert len(notes) == 1 and "output leaf 0 of shape (4, 8)" in notes[0] and "Remedy" in notes[0], traced.notes
    # eager computes 2 h, the exported program 3 h (h = the BatchNorm output on this batch): |difference| = |h|
    stated = float(notes[0].split("max |eager - exported| = ")[1].split(")")[0])
    assert stated == pytest.approx(float((eager / 2).abs().max()), rel=5e-3)  # (3 digits)
    assert any(m.startswith("the exported program differs") for m in caught)
    assert torch.equal(model.bn.running_mean, stats[0]) and torch.equal(model.bn.num_batches_tracked, stats[1])
    assert torch.equal(torch.get_rng_state(), rng)


class WritesThenReads(nn.Module):
    """Forward updates a buffer in place, then reads it: each call must start from the same state."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("ema", torch.zeros(8))

    def forward(self, x):
        with torch.no_grad():
            self.ema.mul_(0.5).add_(x.mean(0))
        return self.lin(x) * self.ema


class WritesItsInput(nn.Module):
    """Forward doubles its input in place, then reads it (eager mutates the caller's tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        x.mul_(2.0)
        return self.lin(x) + x.mean(0)


class WritesItsParameters(nn.Module):
    """Forward writes parameters in place under no_grad, then reads them: a frozen key encoder updated as an
    EMA of the query encoder (MoCo's momentum update) and prototypes re-normalised (SwAV). Before (r13b), the
    trace-time eager check restored buffers only: tracing left k.weight 0.088 and protos.weight 0.196 away
    from the user's values (two updates: the eager call and the exported program's), and the exported
    program, run on the written values, was falsely said to differ from eager (0.325)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(8, 8), nn.Linear(8, 8)
        self.k.requires_grad_(False)
        self.protos = nn.Linear(8, 5, bias=False)

    def forward(self, x):
        with torch.no_grad():
            for pq, pk in zip(self.q.parameters(), self.k.parameters()):
                pk.mul_(0.9).add_(pq.detach() * 0.1)
            self.protos.weight.copy_(torch.nn.functional.normalize(self.protos.weight, dim=1))
        return self.protos(torch.tanh(self.q(x)) + self.k(x))


@pytest.mark.parametrize("make", [lambda: Branchy(branch=False), WritesThenReads, WritesItsInput, WritesItsParameters],
                         ids=["plain", "writes_then_reads", "writes_its_input", "writes_its_parameters"])
def test_a_model_that_computes_the_same_gets_no_note(make):
    torch.manual_seed(0)
    model = make()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(4, 8)
    x0 = x.clone()
    traced, caught = _trace(model, x)
    assert torch.equal(x, x0)  # the comparison's calls ran on copies (export itself writes no real tensor)
    assert not [n for n in traced.notes if "exported program" in n], traced.notes
    assert not [m for m in caught if "exported program" in m]
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # tracing changed no state


def test_what_one_call_cannot_decide_is_skipped_with_a_note(monkeypatch):
    monkeypatch.setattr(eager_check, "MAX_ELEMENTS", 1000)  # the bound, made small (50M in use)
    model, x = nn.Embedding(1000 // 64 + 1, 64, _freeze=True), torch.zeros(2, 3, dtype=torch.long)  # just over, frozen
    traced, _ = _trace(model, x)
    assert any(n.startswith("exported program not compared with eager forward") and "more than 1,000 parameter" in n
               for n in traced.notes), traced.notes


class DropoutBranchy(Branchy):
    """Branchy with dropout after the branch (BERT, GPT-2, ViT and T5 have dropout 0.1 by default)."""

    def __init__(self, branch: bool = True) -> None:
        super().__init__(branch)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(super().forward(x))


@pytest.mark.parametrize("branch", [False, True], ids=["same_path", "export_only_branch"])
def test_a_forward_that_draws_random_numbers_is_compared_from_one_generator_state(branch):
    """Random forwards were skipped ("forward draws random numbers"), so every default-config model with dropout
    (BERT, GPT-2, ViT, T5) went unchecked. Both calls now start from the same generator state: the same path
    draws the same mask (no note, no warning), another path is warned about; torch's RNG state is left as it was."""
    torch.manual_seed(0)
    model, x = DropoutBranchy(branch), torch.randn(4, 8)
    rng = torch.get_rng_state()
    traced, caught = _trace(model, x)
    assert torch.equal(torch.get_rng_state(), rng)
    differs = [n for n in traced.notes if n.startswith("the exported program differs")]
    assert not [n for n in traced.notes if n.startswith("exported program not compared")], traced.notes
    if branch:
        assert len(differs) == 1 and "same generator state" in differs[0], traced.notes
        assert any(m.startswith("the exported program differs") for m in caught)
    else:
        assert not differs and not [m for m in caught if "exported program" in m], traced.notes


def test_a_meta_model_is_not_compared_and_gets_no_extra_note():
    traced, caught = _trace(Branchy().to("meta"), torch.randn(4, 8, device="meta"))
    assert not [n for n in traced.notes if "exported program" in n] and not [m for m in caught if "exported" in m]


class BadIndex(nn.Module):
    """An embedding of 2 rows read with index 2 (trial 10f: TAPAS's 4th token type, 2 rows, given values 0..2):
    export checks no values and traces it; the eager forward raises IndexError, as every sharded rank then did."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.lin = nn.Embedding(2, 8), nn.Linear(8, 8)

    def forward(self, ids):
        return self.lin(self.emb(ids))


def test_an_eager_forward_that_raises_on_the_example_inputs_is_warned_about():
    torch.manual_seed(0)
    model, ids = BadIndex(), torch.tensor([[0, 1, 2]])
    with pytest.raises(IndexError):
        model(ids)  # one device cannot run these inputs
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = parallelizer.trace(model, (ids,))
    said = [str(w.message) for w in caught if "eager forward raises IndexError" in str(w.message)]
    assert len(said) == 1 and "Remedy: fix the example inputs" in said[0], [str(w.message) for w in caught]
    assert any(n.startswith("the model's eager forward raises IndexError") for n in traced.notes)


def _mask_when_traced(h):
    """A library helper (transformers' masking_utils): builds a mask only under tracing, None when called."""
    return torch.zeros(h.shape[0], 1, h.shape[1] + 1) if torch.compiler.is_compiling() else None


class ExportOnlyMask(nn.Module):
    """Raises ValueError only when the export-only mask arrives (trial 10f: Informer's ProbSparse attention and
    Autoformer's auto-correlation reject the mask transformers builds under export; eager gets None and runs).
    The TraceError said "model(*inputs) fails the same way", which was false."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        mask = _mask_when_traced(h)
        if mask is not None and mask.shape[-1] != h.shape[1]:
            raise ValueError(f"mask should be of size {h.shape[1]}, got {mask.shape[-1]}")
        return h


def test_an_error_raised_only_under_export_says_the_model_runs_eagerly():
    model, x = ExportOnlyMask(), torch.randn(2, 4, 8)
    model(x)  # runs eagerly
    with pytest.raises(parallelizer.TraceError) as info:
        parallelizer.trace(model, (x,))
    text = str(info.value)
    assert "raises under torch.export but runs when called on the same inputs" in text, text
    assert "fails the same way" not in text and "is_compiling()" in text.split("Remedy")[1]


class ReorderedOutput(nn.Module):
    """A transformers ModelOutput whose fields are inserted (last_hidden_state, hidden_states, pooler_output),
    which pytree rebuilds in its dataclass order (last_hidden_state, pooler_output, hidden_states), as
    InternVL's and Aria's vision outputs; `export_only` adds 1 to the pooled output under torch.export."""

    def __init__(self, export_only: bool = False) -> None:
        super().__init__()
        self.export_only, self.a, self.b = export_only, nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        h = self.a(x)
        out = BaseModelOutputWithPooling(last_hidden_state=self.b(h), hidden_states=(h,))
        pooled = out.last_hidden_state.mean(1)
        out["pooler_output"] = pooled + 1 if self.export_only and torch.compiler.is_exporting() else pooled
        return out


def test_outputs_rebuilt_in_another_field_order_are_compared_by_key_path():
    """Before, the eager check paired output leaves by position: pooler_output (4, 8) with hidden_states[0]
    (4, 6, 8), and warned that the exported program computes another function (|diff| = inf) for InternVL and
    Aria, whose exported programs compute exactly the model's outputs."""
    torch.manual_seed(0)
    traced, caught = _trace(ReorderedOutput(), torch.randn(4, 6, 8))
    assert not [n for n in traced.notes if "exported program" in n], traced.notes
    assert not [m for m in caught if "exported program" in m]


def test_a_real_difference_in_a_reordered_output_is_still_warned_with_its_path():
    torch.manual_seed(0)
    traced, caught = _trace(ReorderedOutput(export_only=True), torch.randn(4, 6, 8))
    notes = [n for n in traced.notes if n.startswith("the exported program differs")]
    assert len(notes) == 1 and "['pooler_output'] of shape (4, 8): max |eager - exported| = 1)" in notes[0], notes


def test_unflatten_in_order_keeps_the_traced_field_order():
    """The ParallelModule rebuilds its output with `tracer.leaves.unflatten_in_order`: positions
    (`out[1]`, `to_tuple()`) hold the fields the model returned there, bitwise (pure data movement)."""
    from torch.utils import _pytree as pytree

    from parallelizer.tracer.leaves import unflatten_in_order

    torch.manual_seed(0)
    eager = ReorderedOutput()(torch.randn(4, 6, 8))
    leaves, spec = pytree.tree_flatten(eager)
    assert list(pytree.tree_unflatten(leaves, spec).keys()) != list(eager.keys())  # what pytree alone gives
    rebuilt = unflatten_in_order(leaves, spec)
    assert list(rebuilt.keys()) == list(eager.keys())
    assert all(a is b or all(x is y for x, y in zip(a, b)) for a, b in zip(rebuilt.to_tuple(), eager.to_tuple()))



def test_a_pipeline_loss_fn_reads_the_output_fields_at_the_models_positions():
    """The pipeline's last stage rebuilds the output for the user's loss_fn (`pipeline_module._structured_loss`,
    and `loss_fn_weight.loss_fn_weighting` tracing loss_fn on metas) with the traced field order: a loss_fn reading
    `out[1]` gets hidden_states, as on one device. Before, it got pooler_output."""
    from torch.utils import _pytree as pytree

    from parallelizer.runtime.pipeline_module import _structured_loss

    torch.manual_seed(0)
    eager = ReorderedOutput()(torch.randn(4, 6, 8))
    leaves, spec = pytree.tree_flatten(eager)

    def loss_fn(out, target):
        return out[1][0].sum() * 2 + target

    expected = eager.to_tuple()[1][0].sum() * 2 + 1.0
    torch.testing.assert_close(_structured_loss(loss_fn, spec, False, tuple(leaves), torch.tensor(1.0)), expected)


def test_the_pipeline_loss_weighting_traces_loss_fn_on_the_fields_at_the_models_positions():
    """`loss_fn_weight.loss_fn_weighting` rebuilds the output for tracing the user's loss_fn with the traced field
    order: a cross-entropy over `out[1][0]` (hidden_states[0], (4, 6, 8)) against 24 targets traces and gives a
    weighting. Before, `out[1]` was pooler_output (4, 8), the trace failed on the shapes and the weighting was
    silently dropped (None: the caller's fallback count)."""
    from torch.utils import _pytree as pytree

    from parallelizer.runtime.loss_fn_weight import loss_fn_weighting

    torch.manual_seed(0)
    eager = ReorderedOutput()(torch.randn(4, 6, 8))
    leaves, spec = pytree.tree_flatten(eager)
    target = torch.randint(0, 8, (24,))

    def loss_fn(out, t):
        return torch.nn.functional.cross_entropy(out[1][0].reshape(-1, 8), t)

    loss_fn(eager, target)  # runs on the model's own output
    assert loss_fn_weighting(loss_fn, [x.detach() for x in leaves], spec, target) is not None
