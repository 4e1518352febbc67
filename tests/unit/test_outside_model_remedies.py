"""Remedies for two refusals of transformers models (round 18): GPT-OSS's grouped_mm experts under data-parallel
axis roles, and X-MOD's per-language adapters (boolean indexing inside an installed package), with the members of
each class: every data-dependent-shape op made inside an installed package's code names the call and how to
replace code the user cannot edit."""
import sys
import textwrap

import pytest
import torch

import parallelizer
from parallelizer.errors import InfeasiblePlanError, TraceError

transformers = pytest.importorskip("transformers")


def _gpt_oss(experts: str | None = None):
    torch.manual_seed(0)
    cfg = transformers.GptOssConfig(vocab_size=64, hidden_size=32, intermediate_size=16, num_hidden_layers=1,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
                                    num_experts_per_tok=2, use_cache=False, attention_dropout=0.0,
                                    layer_types=["full_attention"])
    model = transformers.GptOssForCausalLM(cfg).float()
    if experts is not None:
        model.set_experts_implementation(experts)
    ids = torch.randint(3, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    return model, (ids,), {"labels": ids}


@pytest.mark.parametrize("role", ["ddp", "fsdp"])
def test_grouped_mm_experts_under_data_roles_name_the_experts_and_the_per_token_path(role):
    """GPT-OSS's experts sort the whole batch's tokens by expert (`offs` are global row positions), so a data role
    refuses it; the message names the experts op and the remedy, and the remedy plans under the same role (its
    rehearsal on 2 gloo ranks matches one device: ratio 0.031 ddp / fsdp, RESULTS.md round 18 r18b). On main the
    message blamed in-batch contrastive losses and graph networks and named no remedy for the model."""
    model, args, kwargs = _gpt_oss()
    traced = parallelizer.trace(model, args, kwargs)
    with pytest.raises(InfeasiblePlanError) as caught:
        parallelizer.plan(traced, {"dp": 2}, axis_roles={"dp": role})
    text = str(caught.value)
    assert "grouped_mm_fallback (transformers.grouped_mm_fallback.default) runs transformers' grouped_mm experts" in text
    assert 'model.set_experts_implementation("batched_mm")' in text
    model, args, kwargs = _gpt_oss("batched_mm")
    eager = model(*args, **kwargs).loss
    plan = parallelizer.plan(parallelizer.trace(model, args, kwargs), {"dp": 2}, axis_roles={"dp": role})
    assert plan.mesh.world_size == 2
    # the per-token path computes the same model: its loss equals the grouped_mm path's on one device
    torch.testing.assert_close(eager, _gpt_oss()[0](*args, **kwargs).loss)


SELECTIONS = {  # one member of the class per data-dependent-shape op (the library's line: `out = select(h, y)`)
    "boolean index": "h[y[:, 0] > 0]",
    "nonzero": "h[torch.nonzero(y[:, 0] > 0).squeeze(1)]",
    "masked_select": "torch.masked_select(h, y > 0)",
    "unique": "h * torch.unique(y).sum()",
    "repeat_interleave with tensor repeats": "torch.repeat_interleave(h, y[:, 0].long().clamp(0, 2), dim=0)",
    "argwhere": "h[torch.argwhere(y[:, 0] > 0)[:, 0]]",
}


@pytest.fixture
def installed_package(tmp_path, monkeypatch):
    """A package `fakelib` under a site-packages folder (as pip installs transformers), whose module `sel_<i>`
    selects rows of a Linear's output with one data-dependent-shape op of SELECTIONS."""
    root = tmp_path / "site-packages" / "fakelib"
    root.mkdir(parents=True)
    (root / "__init__.py").write_text("")
    for i, expr in enumerate(SELECTIONS.values()):
        (root / f"sel_{i}.py").write_text(textwrap.dedent(f"""\
            import torch


            class Selecting(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = torch.nn.Linear(4, 4)

                def select(self, h, y):
                    return {expr}

                def forward(self, x, y):
                    out = self.select(self.fc(x), y)
                    return out.sum()
            """))
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    yield
    for name in [m for m in sys.modules if m.startswith("fakelib")]:
        del sys.modules[name]


@pytest.mark.parametrize("i", range(len(SELECTIONS)), ids=list(SELECTIONS))
def test_data_dependent_shape_in_an_installed_package_names_the_call_and_how_to_replace_it(installed_package, i):
    """On main the remedy said to use torch.where instead of x[mask] without saying the line is the package's
    (X-MOD: `modeling_xmod.py:435`, the call of `lang_adapter`), which the user cannot edit."""
    module = __import__(f"fakelib.sel_{i}", fromlist=["Selecting"]).Selecting()
    with pytest.raises(TraceError) as caught:
        parallelizer.trace(module, (torch.randn(6, 4), torch.randn(6, 4)))
    text = str(caught.value)
    assert f"installed package fakelib (not your code), in the call at sel_{i}.py:13 " in text
    assert "`out = self.select(self.fc(x), y)`" in text
    assert "a subclass of the module overriding the method" in text


def test_own_code_keeps_the_plain_remedy():
    """The user's own line (not under site-packages) gets the plain remedy, without the package sentence."""
    class Own(torch.nn.Module):
        def forward(self, x):
            return x[x[:, 0] > 0].sum()

    with pytest.raises(TraceError) as caught:
        parallelizer.trace(Own(), (torch.randn(6, 4),))
    assert "installed package" not in str(caught.value)
    assert "torch.where(mask, x, 0)" in str(caught.value)


def _xmod():
    torch.manual_seed(0)
    cfg = transformers.XmodConfig(vocab_size=64, hidden_size=32, intermediate_size=16, num_hidden_layers=1,
                                  num_attention_heads=4, languages=["en_XX", "de_DE"], default_language="en_XX",
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=2)
    model = transformers.XmodForSequenceClassification(cfg)
    ids = torch.randint(3, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    return model, (ids,), {"lang_ids": torch.tensor([0, 1]), "labels": torch.tensor([0, 1])}


def _fixed_adapter(self, lang_ids, hidden_states):
    """The remedy the error gives, applied to X-MOD's `XmodOutput.lang_adapter`: every adapter on all rows, the
    language's picked with torch.where (fixed shapes)."""
    residual = hidden_states if not self.ln_before_adapter else None
    if self.adapter_layer_norm is not None:
        hidden_states = self.adapter_layer_norm(hidden_states)
    elif self.adapter_reuse_layer_norm:
        hidden_states = self.LayerNorm(hidden_states)
    if self.ln_before_adapter:
        residual = hidden_states
    new = torch.zeros_like(hidden_states)
    for idx, key in enumerate(self.adapter_modules.keys()):
        mask = (lang_ids == idx).reshape(-1, *([1] * (hidden_states.dim() - 1)))
        new = torch.where(mask, self.adapter_modules[key](hidden_states), new)
    return self.dropout(new) + residual


def test_xmod_names_the_adapter_call_and_its_remedy_traces_the_same_model():
    model, args, kwargs = _xmod()
    with pytest.raises(TraceError) as caught:
        parallelizer.trace(model, args, kwargs)
    text = str(caught.value)
    assert "installed package transformers" in text and "self.lang_adapter(lang_ids, hidden_states)" in text
    eager = model(*args, **kwargs).loss  # the right value: the unchanged model on one device
    for mod in model.modules():
        if type(mod).__name__ == "XmodOutput":
            mod.lang_adapter = _fixed_adapter.__get__(mod)
    torch.testing.assert_close(model(*args, **kwargs).loss, eager)
    traced = parallelizer.trace(model, args, kwargs)
    assert traced.nodes  # traces now
