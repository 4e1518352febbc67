"""Issue 12, item 1: every transformers family built from its config class with DEFAULT options (cache on)
traces for training; the traced program computes eager's numbers; the cache is turned off only while tracing,
and what cannot be traced says which construct and what to do."""
import pytest
import torch
from torch.utils import _pytree as pytree

import parallelizer
from parallelizer import TraceError
from parallelizer.zoo import families


def _first_tensor(output) -> torch.Tensor:
    return next(t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor))


@pytest.mark.parametrize("name", sorted(families.FAMILIES))
def test_family_with_default_config_traces_and_matches_eager(name):
    model, args, kwargs = families.FAMILIES[name]()
    caching = {id(m.config): m.config for m in model.modules()
               if getattr(getattr(m, "config", None), "use_cache", None) is True}
    traced = parallelizer.trace(model, args, kwargs)
    assert all(c.use_cache is True for c in caching.values())  # the user's configs are restored
    if caching:
        assert any("use_cache=False" in note for note in traced.notes), traced.notes
    expected = _first_tensor(model(*args, **kwargs))  # eager, one device: the loss or the first output
    got = _first_tensor(traced.exported.module()(*args, **kwargs))
    torch.testing.assert_close(got, expected)  # two op graphs (split biases): float32 tolerances


def test_explicit_use_cache_true_is_refused_with_a_remedy():
    model, args, kwargs = families.llama()
    with pytest.raises(TraceError, match=r"use_cache=True.*\nRemedy: drop use_cache from the inputs or pass "
                                         r"use_cache=False"):
        parallelizer.trace(model, args, {**kwargs, "use_cache": True})
    parallelizer.trace(model, args, {**kwargs, "use_cache": False})  # the remedy works


class _ReturnsAnObject(torch.nn.Module):
    class Box:
        def __init__(self, t):
            self.t = t

    def forward(self, x):
        return x * 2, self.Box(x)


def test_an_output_of_an_unknown_type_names_it_and_the_remedy():
    with pytest.raises(TraceError, match=r"(?s)an output of type .*Box.*register_pytree_node"):
        parallelizer.trace(_ReturnsAnObject(), (torch.randn(2),))


def test_an_error_of_the_model_itself_says_so():
    """T5Config() has no decoder_start_token_id, so T5 with labels= fails in eager too: the TraceError says the
    model's own code raised and that eager fails the same way (it does), not that tracing is the problem."""
    from transformers import T5Config, T5ForConditionalGeneration

    model = T5ForConditionalGeneration(T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
                                                vocab_size=64))
    ids = torch.randint(0, 64, (2, 8))
    with pytest.raises(AttributeError, match="decoder_start_token_id"):
        model(ids, labels=ids)
    with pytest.raises(TraceError, match=r"forward raised AttributeError in code outside torch.*\n.*"
                                         r"decoder_start_token_id'\nRemedy: this is an error of the model"):
        parallelizer.trace(model, (ids,), {"labels": ids})
