"""Issue 12, item 1: every transformers family built from its config class with DEFAULT options (cache on)
traces for training; the traced program computes eager's numbers; the cache object is dropped from the output,
and what cannot be traced says which construct and what to do."""
import pytest
import torch
from torch.utils import _pytree as pytree

import parallelizer
from parallelizer import TraceError
from parallelizer.tracer.cache_output import is_cache
from parallelizer.zoo import families


def _first_tensor(output) -> torch.Tensor:
    return next(t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor))


@pytest.mark.parametrize("name", sorted(families.FAMILIES))
def test_family_with_default_config_traces_and_matches_eager(name):
    model, args, kwargs = families.FAMILIES[name]()
    caching = {id(m.config): m.config for m in model.modules()
               if getattr(getattr(m, "config", None), "use_cache", None) is True}
    traced = parallelizer.trace(model, args, kwargs)
    assert all(c.use_cache is True for c in caching.values())  # the user's settings are left alone
    eager = model(*args, **kwargs)
    if any(is_cache(v) for v in eager.values()):  # (BART with labels= turns its cache off itself)
        assert any("own use_cache setting" in note for note in traced.notes), traced.notes
    expected = _first_tensor(eager)  # eager, one device: the loss or the first output
    got = _first_tensor(traced.exported.module()(*args, **kwargs))
    torch.testing.assert_close(got, expected)  # two op graphs (split biases): float32 tolerances


def test_explicit_use_cache_true_traces_as_the_default():
    """use_cache=True passed explicitly is the config's default: traced with it, the cache dropped from the
    output, the same graph and values as without it."""
    model, args, kwargs = families.llama()
    plain = parallelizer.trace(model, args, kwargs)
    explicit = parallelizer.trace(model, args, {**kwargs, "use_cache": True})
    def ops(traced):
        return [n.target for n in traced.graph_module.graph.nodes if n.op == "call_function"]
    assert ops(explicit) == ops(plain)
    assert explicit.constant_inputs == {"use_cache": True}
    torch.testing.assert_close(explicit.exported.module()(*args, **kwargs, use_cache=True).loss,
                               model(*args, **kwargs).loss)


def _packed_call(model_builder):
    model, args, kwargs = model_builder()
    ids = args[0] if args else kwargs["input_ids"]
    pos = torch.arange(ids.shape[1]).repeat(ids.shape[0], 1)
    pos[0, 3:] -= 3  # two sequences packed in row 0
    return model, {"input_ids": ids, "position_ids": pos}


def test_packed_position_ids_without_mask_on_a_caching_config_match_the_model():
    """transformers masks packed sequences (position_ids restarting in a row) only without a cache. Tracing used
    to turn use_cache off, so the traced graph masked across the packed row that the model with its default
    use_cache=True attends across (logits 0.21 off, no error). Traced with the model's own setting (the cache
    dropped from the output), the program computes the model's logits, and with use_cache=False (the other
    function) it computes that one's: each traced setting is the user's."""
    model, call = _packed_call(families.llama)
    eager = model(**call).logits
    traced = parallelizer.trace(model, (), call)
    assert not any(n.target is torch.ops.aten.lift_fresh_copy.default for n in traced.graph_module.graph.nodes)
    torch.testing.assert_close(traced.exported.module()(**call).logits, eager)
    model.config.use_cache = False
    masked = model(**call).logits
    assert not torch.allclose(masked[0], eager[0])  # the two settings are two functions on the packed row
    torch.testing.assert_close(parallelizer.trace(model, (), call).exported.module()(**call).logits, masked)


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


class _SkipsDefaultMaskWhenTraced(torch.nn.Module):
    """transformers' SwitchTransformers / LongT5 pattern: the default mask is built only when not compiling."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, mask=None):
        if mask is None and not torch.compiler.is_compiling():
            mask = torch.ones(x.shape[:-1])
        return self.lin(x) * mask[..., None]


def test_a_path_taken_only_when_traced_is_not_called_the_models_own_error():
    """Trial h1: SwitchTransformers with default options runs eagerly but skips its default attention_mask under
    export; the TraceError said "model(*inputs) fails the same way", which is false. It names the branch and
    says to pass the input; with the input given, it traces."""
    model, x = _SkipsDefaultMaskWhenTraced(), torch.randn(2, 3, 4)
    model(x)  # eager runs
    with pytest.raises(TraceError, match=r"takes another path when traced than eagerly .*is_compiling\(\)`.*\n.*\n"
                                         r"Remedy: pass the inputs that path leaves out") as info:
        parallelizer.trace(model, (x,))
    assert "fails the same way" not in str(info.value)
    parallelizer.trace(model, (x,), {"mask": torch.ones(2, 3)})


class _CastsItsRouterEveryCall(torch.nn.Module):
    """SwitchTransformers' router: `self.classifier = self.classifier.to(self.dtype)` in forward (a no-op)."""

    def __init__(self):
        super().__init__()
        self.classifier = torch.nn.Linear(4, 3)

    def forward(self, x):
        self.classifier = self.classifier.to(torch.float32)
        return self.classifier(x.to(torch.float32)).softmax(-1)


def test_a_module_to_that_changes_nothing_in_forward_traces():
    """Under export `Module._apply` tried to swap each fake parameter: TraceError "Couldn't swap Linear.weight"
    for a `.to` that is the module itself eagerly."""
    model, x = _CastsItsRouterEveryCall(), torch.randn(2, 4)
    traced = parallelizer.trace(model, (x,))
    torch.testing.assert_close(traced.exported.module()(x), model(x))
    assert torch.nn.Module.to.__name__ == "to" and torch.nn.Module.to.__qualname__ == "Module.to"  # restored


class _AssertsOnAValue(torch.nn.Module):
    """ProphetNet's `_shift_right`: `assert torch.all(shifted_input_ids >= 0).item(), "..."`."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        assert torch.all(x > -100).item(), "values must be above -100"
        return self.lin(x)


def test_an_assert_on_a_tensor_value_says_so():
    """Trial h1: ProphetNet with default options; the remedy was 'branch with torch.where or torch.cond'."""
    with pytest.raises(TraceError, match=r"an assert on a tensor value \(`assert torch.all\(x > -100\).item\(\)`\)"
                                         r"(.|\n)*Remedy: remove the assert \(or the check that raises\) for the sharded run, or write it as torch._check"):
        parallelizer.trace(_AssertsOnAValue(), (torch.randn(2, 4),))


class _RaisesOnAValue(torch.nn.Module):
    """Wav2Vec2ForCTC: `if labels is not None and labels.max() >= self.config.vocab_size: raise ValueError(...)`."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, labels):
        if labels.max() >= 4:
            raise ValueError("labels must be below 4")
        return torch.nn.functional.cross_entropy(self.lin(x), labels)


def test_a_check_that_raises_on_a_tensor_value_says_so():
    with pytest.raises(TraceError, match=r"an assert on a tensor value \(`if labels.max\(\) >= 4: raise`\)"):
        parallelizer.trace(_RaisesOnAValue(), (torch.randn(2, 4), torch.tensor([1, 2])))


class _Composite(torch.nn.Module):
    """A composite model returning its language model's output NESTED (InstructBLIP / BLIP-2's
    `language_model_outputs`): with the LM's default use_cache=True a DynamicCache sits inside a ModelOutput
    (return_dict) or a tuple inside the tuple (return_dict=False)."""

    def __init__(self, return_dict: bool) -> None:
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM
        torch.manual_seed(0)
        self.lm = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                               num_attention_heads=2, num_key_value_heads=1, vocab_size=32))
        self.proj = torch.nn.Linear(16, 16)
        self.return_dict = return_dict

    def forward(self, input_ids, labels):
        out = self.lm(input_ids=input_ids, labels=labels, return_dict=self.return_dict)
        loss = out[0]
        return (loss, out) if not self.return_dict else {"loss": loss, "lm_outputs": out, "extra": [out.logits]}


@pytest.mark.parametrize("return_dict", [False, True])
def test_a_cache_nested_in_the_output_is_dropped(return_dict):
    """Before (r13b) only a cache at the top level of the output was dropped: InstructBLIP with its default
    config raised TraceError ('an output of type DynamicCache') for its nested language-model output. Now the
    nested cache is dropped, noted, and the exported program returns the model's loss and logits."""
    model = _Composite(return_dict)
    ids = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(1))
    assert any(is_cache(v) for v in pytree.tree_leaves(model(ids, ids), is_leaf=is_cache))  # a cache is nested
    traced = parallelizer.trace(model, (ids, ids))
    assert any("own use_cache setting" in n for n in traced.notes), traced.notes
    eager, exported = model(ids, ids), traced.exported.module()(ids, ids)
    assert not any(is_cache(v) for v in pytree.tree_leaves(exported, is_leaf=is_cache))
    lm_eager = eager[1] if not return_dict else eager["lm_outputs"]
    lm_exported = exported[1] if not return_dict else exported["lm_outputs"]
    torch.testing.assert_close(exported[0] if not return_dict else exported["loss"], lm_eager[0])
    torch.testing.assert_close(lm_exported[1], lm_eager[1])  # the logits
