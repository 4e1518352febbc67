"""Copies of the user's model that this package makes, and the model after tracing (round 14, trial r14b: models
from x-transformers). A function stored on a module that closes over the module (x-transformers' tied head
`self.to_logits = lambda t: t @ self.token_emb.emb.weight.t()`, a hook closing over `self`) must compute with the
copy's tensors; a tensor a forward stores on a module (x-transformers' ALiBi cache registered in forward) must
not be left a FakeTensor by tracing. Expected values come from the eager model on one device."""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import parallelizer
from parallelizer.runtime.module_copy import copy_module
from parallelizer.runtime.pipeline_rehearsal import _float64_reference


@pytest.fixture(autouse=True)
def _no_leftover_process_group():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


class LambdaTied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 16)
        self.mid = nn.Linear(16, 16)
        self.drop = nn.Dropout(0.0)  # a module whose mode the eval program changes
        self.to_logits = lambda t: t @ self.emb.weight.t()

    def forward(self, ids):
        return self.to_logits(self.drop(torch.tanh(self.mid(self.emb(ids)))))


def _ids():
    return torch.randint(0, 20, (4, 6), generator=torch.Generator().manual_seed(1))


def _trained_pair(steps=2):
    torch.manual_seed(0)
    model = LambdaTied()
    torch.manual_seed(0)
    reference = LambdaTied()
    ids = _ids()
    pm = parallelizer.auto_parallelize(model, (ids,))
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-1) for m in (pm, reference)]
    for _ in range(steps):
        for m, opt in zip((pm, reference), opts):
            F.cross_entropy(m(ids).flatten(0, 1), ids.flatten()).backward()
            opt.step()
            opt.zero_grad()
    return pm, reference, ids


def test_eval_program_of_a_head_tied_through_a_lambda_uses_the_trained_embedding():
    """Before: the eval program (traced from a deepcopy skeleton whose lambda read the original model) used the
    embedding as it was when wrapped, as a constant: outputs 1.19 off eager after 2 AdamW steps."""
    pm, reference, ids = _trained_pair()
    pm.eval()
    reference.eval()
    torch.testing.assert_close(pm(ids), reference(ids))


def test_full_model_of_a_head_tied_through_a_lambda_computes_with_its_own_embedding():
    """Before: `full_model()` was a deepcopy whose lambda read the wrapped model's untrained embedding (1.19 off)."""
    pm, reference, ids = _trained_pair()
    with pm.full_model(writeback=False) as full:
        torch.testing.assert_close(full(ids), reference(ids))
        assert full.to_logits(torch.ones(1, 16)).shape == (1, 20)


def test_copy_module_rebinds_closures_over_the_model_its_parameters_and_hooks():
    torch.manual_seed(0)
    model = LambdaTied()
    weight = model.mid.weight
    model.scaled = lambda t: t * weight.sum()  # closes over a parameter
    model.mid.register_forward_hook(lambda mod, args, out: out + model.emb.weight[0, 0])  # over the root
    ids = _ids()
    expected = model(ids), model.scaled(torch.ones(2))
    clone = copy_module(model)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-3.0)  # the original changes; the copy must not follow
    torch.testing.assert_close((clone(ids), clone.scaled(torch.ones(2))), expected)
    assert clone.to_logits.__code__ is model.to_logits.__code__
    plain = nn.Linear(2, 2)
    assert copy_module(nn.Sequential(plain))[0].forward.__func__ is nn.Linear.forward


def test_pipeline_float64_reference_of_a_head_tied_through_a_lambda_is_made():
    """Before: the float64 copy's lambda read the float32 original, so the copy raised a dtype error and the
    pipeline rehearsal lost its float64 judge (`_float64_reference` returned None; now the reason, a str)."""
    torch.manual_seed(0)
    model, ids = LambdaTied(), _ids()
    made = _float64_reference(model, (ids,), {}, 1, None)
    assert not isinstance(made, str), made
    wide, (args, kwargs) = made
    torch.testing.assert_close(wide(*args, **kwargs).float(), model(ids), rtol=1e-5, atol=1e-5)


class RegistersInForward(nn.Module):
    """A bias cached by `register_buffer` on the first call (x-transformers' ALiBi), and a tensor attribute."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.register_buffer("bias", None, persistent=False)

    def forward(self, x):
        if self.bias is None or self.bias.shape[-1] < x.shape[-1]:
            self.register_buffer("bias", torch.arange(x.shape[-1], dtype=x.dtype) * 0.1, persistent=False)
        self.last = x.detach()
        return self.lin(x) + self.bias


def test_tracing_leaves_no_fake_tensor_where_forward_stored_one_and_notes_it():
    """Before: export left FakeTensors in the slots, and the model raised on its next call; and torch.export
    recorded the stored bias as a write into the input x (`copy_(x, bias)`), so the program raised a
    VerificationError building (plain export's program overwrote the caller's x, 1.66 off)."""
    torch.manual_seed(0)
    model, x = RegistersInForward(), torch.randn(3, 6)
    expected = RegistersInForward()
    expected.load_state_dict(model.state_dict())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = parallelizer.trace(model, (x,))
    assert model.bias is None and "last" not in vars(model)
    torch.testing.assert_close(model(x), expected(x))
    assert any("forward stores tensors on the model (last, bias)" in n for n in traced.notes), traced.notes
    assert any("forward stores tensors" in str(w.message) for w in caught)
    assert not any(n.target is torch.ops.aten.copy_.default for n in traced.graph_module.graph.nodes)
    torch.manual_seed(0)
    pm = parallelizer.auto_parallelize(RegistersInForward(), (x,))
    before = x.clone()
    torch.testing.assert_close(pm(x), expected(x))
    torch.testing.assert_close(x, before, rtol=0, atol=0)  # the caller's input is not written


class MaskCachedOnNone(nn.Module):
    """pytorch/examples word_language_model's TransformerModel: `self.src_mask = None` in __init__, the causal
    mask stored there by forward and read back on the next call."""

    def __init__(self):
        super().__init__()
        self.src_mask = None
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        if self.src_mask is None or self.src_mask.size(0) != x.shape[1]:
            self.src_mask = torch.log(torch.tril(torch.ones(x.shape[1], x.shape[1])))
        return torch.softmax(self.fc(x) @ self.fc(x).transpose(1, 2) + self.src_mask, -1) @ x


def test_an_attribute_that_held_none_before_forward_stored_a_tensor_there_holds_none_again():
    """Before: tracing (and every eager check under `tensor_slots_kept`) deleted the attribute, so the user's model
    raised AttributeError on its next call, and so did `pm.eval()` re-tracing a copy of it (trial r16b)."""
    from parallelizer.tracer.microbatch_check import microbatch_mixing
    torch.manual_seed(0)
    model, x = MaskCachedOnNone(), torch.randn(4, 5, 6)
    expected = MaskCachedOnNone()
    expected.load_state_dict(model.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallelizer.trace(model, (x,))
        assert "src_mask" in vars(model) and model.src_mask is None
        microbatch_mixing(model, (x,), {}, 2)
        assert "src_mask" in vars(model) and model.src_mask is None
        torch.testing.assert_close(model(x), expected(x))
        torch.manual_seed(0)
        pm = parallelizer.auto_parallelize(MaskCachedOnNone(), (x,))
        pm.eval()
        torch.testing.assert_close(pm(x), expected.eval()(x))


class HookWeightNorm(nn.Module):
    """`torch.nn.utils.weight_norm` (the hook form, diffusers' AutoencoderOobleck, HiFi-GAN-style vocoders): the
    conv's `weight` is a plain attribute computed from weight_g / weight_v, no graph leaf."""

    def __init__(self):
        super().__init__()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch deprecates the hook form
            self.conv = nn.utils.weight_norm(nn.Conv1d(2, 4, 3, padding=1))
        self.drop = nn.Dropout(0.0)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.drop(self.conv(x)).mean(-1))


def test_copies_of_a_hook_weight_norm_model_are_made_and_train_and_evaluate_as_one_device():
    """Before: every copy raised torch's "Only Tensors created explicitly by the user (graph leaves) support the
    deepcopy protocol" (trial r16b: `rehearse` of diffusers' AutoencoderOobleck failed on every rank; `pm.eval()`
    and `full_model()` raised)."""
    x = torch.randn(4, 2, 8, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    model = HookWeightNorm()
    torch.manual_seed(0)
    reference = HookWeightNorm()
    clone = copy_module(model)
    torch.manual_seed(0)
    twin = HookWeightNorm()
    with torch.no_grad():
        for m in (clone, twin):  # the copy computes with its own weight_g, not the original's
            m.conv.weight_g.mul_(2.0)
    torch.testing.assert_close(clone(x), twin(x))
    assert not torch.allclose(clone(x), model(x))
    pm = parallelizer.auto_parallelize(model, (x,))
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-1) for m in (pm, reference)]
    for _ in range(2):
        for m, opt in zip((pm, reference), opts):
            m(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    with pm.full_model(writeback=False) as full:
        torch.testing.assert_close(full(x), reference(x))
    pm.eval()
    reference.eval()
    torch.testing.assert_close(pm(x), reference(x))
