"""A model traced on meta (what `parallelizer plan` does) and the same model traced on CPU (what a user's run
and `parallelizer rehearse` do) are one graph, node by node (`tracer/device_free.py`).

Before: GPT-2, Llama, OPT and Falcon traced on meta held the KV cache's empty constants with `detach_` nodes,
Falcon on CPU read its constants through `lift_fresh_copy`, a view after a `.contiguous()` that was a no-op on
CPU stayed a view, and BART's `shift_tokens_right` (`x[:, 0] = start_id`) was `fill_` of a CPU constant on CPU
and `copy_` of an expanded `scalar_tensor` on meta, which shifted every later node name. A CLI plan then failed
`parallelizer rehearse` on every rank (UnsupportedOpError for `%lift_fresh_copy`) or was refused by
`auto_parallelize(plan=...)` with a PlanMismatchError. Each member of the class has a case below; the CPU graph
after normalisation still computes eager's values.
"""
import re

import pytest
import torch
from torch import nn

import parallelizer
from parallelizer import cli
from parallelizer.errors import PlanMismatchError
from parallelizer.fingerprint import graph_fingerprint
from parallelizer.zoo import families


def falcon(device: str = "cpu"):
    """FalconForCausalLM (default cache, constants created in forward), token ids (2, 16)."""
    import transformers

    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.FalconForCausalLM(transformers.FalconConfig(
            vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, hidden_dropout=0.0,
            attention_dropout=0.0))
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    return model, (ids.to(device),), {"labels": ids.to(device)}


def opt(device: str = "cpu"):
    import transformers

    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.OPTForCausalLM(transformers.OPTConfig(
            vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
            word_embed_proj_dim=32, dropout=0.0, attention_dropout=0.0, layerdrop=0.0))
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    return model, (ids.to(device),), {"labels": ids.to(device)}


def bart(device: str = "cpu"):
    """BART with labels= only: `shift_tokens_right` writes the start token into a slice."""
    return families.bart(device=device)


def mbart_one_row(device: str = "cpu"):
    """MBart with labels= at batch 1: its `shift_tokens_right` writes a gathered, squeezed (0-dim) start token
    into a slice, `fill_.Tensor` on CPU and `copy_` of an `expand` elsewhere."""
    import transformers

    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.MBartForConditionalGeneration(transformers.MBartConfig(
            vocab_size=128, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, dropout=0.0, attention_dropout=0.0,
            activation_dropout=0.0, max_position_embeddings=64))
    ids = torch.randint(3, 128, (1, 12), generator=torch.Generator().manual_seed(0))
    labels = torch.randint(3, 128, (1, 10), generator=torch.Generator().manual_seed(1))
    return model, (ids.to(device),), {"labels": labels.to(device)}


class LegacyParameter(nn.Module):
    """A parameter made by a legacy constructor, which ignores `with torch.device(...)` (XLNet's `mask_emb`)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.FloatTensor(8).fill_(0.5))

    def forward(self, x):
        return self.proj(x) * self.scale


def legacy(batch: int = 4, **_):
    return LegacyParameter(), (torch.randn(batch, 8),)


class TiedLegacy(nn.Module):
    """Tied embedding / head beside a legacy-constructor parameter (the CPU leftover that is moved to meta)."""

    def __init__(self, vocab: int = 32, dim: int = 8):
        super().__init__()
        self.emb, self.head = nn.Embedding(vocab, dim), nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight
        self.gain = nn.Parameter(torch.FloatTensor(dim).fill_(1.0))

    def forward(self, ids):
        return nn.functional.cross_entropy(self.head(self.emb(ids) * self.gain).flatten(0, 1), ids.flatten())


def tied_kwargs(batch: int = 4, **config):
    """A factory with only **kwargs: it used to receive `device="meta"` (taken for a device parameter)."""
    assert "device" not in config, config
    return TiedLegacy(**config), (torch.randint(0, 32, (batch, 6), generator=torch.Generator().manual_seed(0)),)


class Patterns(nn.Module):
    """One op pattern per mode that torch.export records differently on meta and on CPU."""

    def __init__(self, mode: str):
        super().__init__()
        self.mode, self.proj = mode, nn.Linear(8, 8)

    def forward(self, x, ids):
        h = self.proj(x)
        if self.mode == "slice_int":  # shift_tokens_right
            s = ids.new_zeros(ids.shape)
            s[:, 1:] = ids[:, :-1].clone()
            s[:, 0] = 2
            return h * s.float().mean()
        if self.mode == "slice_float":
            h = h.clone()
            h[:, 3:5] = 0.5
            return h
        if self.mode == "mask":
            h = h.clone()
            h[h > 0.1] = -1.0
            return h
        if self.mode == "ignore_index":  # labels[labels == pad] = -100
            s = ids.clone()
            s[s == 3] = 0
            return h * s.float().mean()
        if self.mode == "constant":  # torch.tensor(...) in forward: lift_fresh_copy + detach_ on CPU
            return h * torch.tensor(2.0) + torch.tensor(0.5, device=h.device)
        if self.mode == "computed_into_slice":  # a 0-dim value that is no constant
            h2 = h.clone()
            h2[:, 0] = h.sum()
            return h2
        if self.mode == "device_tensor_into_slice":
            h = h.clone()
            h[:2, :2] = torch.tensor(7.0, device=h.device)
            return h
        if self.mode == "type_as_constant":  # DeBERTa-v2's make_log_bucket_position
            return torch.where(h > 0, h, torch.tensor(3.0).type_as(h))
        if self.mode == "number_then_vector":  # a number lifted on CPU only, then another constant
            s = ids.clone()
            s[:, 0] = 2
            return h * torch.tensor([1.0] * 8, device=h.device) + s.float().mean()
        if self.mode == "list_index":
            h = h.clone()
            h[[0, 2], 1] = 3.0
            return h
        if self.mode == "heads":  # attention's `.transpose(1, 2).contiguous().view(...)`: the copy is a no-op on
            q = h.view(1, h.shape[0], 2, 4).transpose(1, 2)  # CPU (SDPA's strides), recorded on meta
            out = nn.functional.scaled_dot_product_attention(q, q, q).transpose(1, 2).contiguous()
            return out.view(h.shape[0], 8)
        raise ValueError(self.mode)


def _patterns(mode):
    def build(device):
        torch.manual_seed(0)
        with torch.device(device):
            model = Patterns(mode)
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
        ids = torch.randint(0, 6, (4, 6), generator=torch.Generator().manual_seed(2))
        return model, (x.to(device), ids.to(device)), {}
    return build


PATTERNS = ("slice_int", "slice_float", "mask", "ignore_index", "constant", "heads", "computed_into_slice",
            "device_tensor_into_slice", "type_as_constant", "number_then_vector", "list_index")
BUILDERS = {"falcon": falcon, "opt": opt, "bart": bart, "mbart_one_row": mbart_one_row,
            "gpt2": lambda d: families.gpt2(device=d), "llama": lambda d: families.llama(device=d),
            **{f"pattern_{m}": _patterns(m) for m in PATTERNS}}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_meta_and_cpu_traces_are_one_graph_and_cpu_matches_eager(name):
    build = BUILDERS[name]
    traced = {device: parallelizer.trace(*build(device)) for device in ("meta", "cpu")}
    meta, cpu = (graph_fingerprint(traced[d]) for d in ("meta", "cpu"))
    assert [(n.name, n.op_name) for n in traced["meta"].nodes.values()] == \
        [(n.name, n.op_name) for n in traced["cpu"].nodes.values()]
    assert meta["sha256"] == cpu["sha256"]  # shapes and dtypes too
    model, args, kwargs = build("cpu")
    expected = model(*args, **kwargs)
    got = traced["cpu"].exported.module()(*args, **kwargs)
    expected = expected.loss if hasattr(expected, "loss") else expected
    got = got.loss if hasattr(got, "loss") else got
    torch.testing.assert_close(got, expected)  # two op graphs: float32 tolerances


def test_op_names_are_numbered_in_graph_order_without_gaps():
    """After normalisation removed nodes (cache leftovers, contiguous, asserts), names do not depend on what was
    removed: per base name, `base`, `base_1`, `base_2`, ... in graph order (fx skips Python builtins: `sum_1`)."""
    traced = parallelizer.trace(*falcon("meta"))
    seen: dict[str, list[int]] = {}
    for node in traced.graph_module.graph.nodes:
        if node.op == "call_function":
            base, _, number = re.fullmatch(r"(.*?)(_(\d+))?", node.name).groups()
            seen.setdefault(base, []).append(int(number) if number else 0)
    for base, numbers in seen.items():
        start = numbers[0]
        assert numbers == list(range(start, start + len(numbers))) and start in (0, 1), (base, numbers)


@pytest.mark.parametrize("name", ["falcon", "opt", "bart", "mbart_one_row"])
def test_a_plan_made_on_meta_fits_the_model_built_on_cpu(name):
    meta = parallelizer.trace(*BUILDERS[name]("meta"))
    plan = parallelizer.plan(meta, {"dp": 2})
    parallelizer.check_plan(plan, parallelizer.trace(*BUILDERS[name]("cpu")), {"dp": 2})  # raises if not


def test_device_dependent_model_code_is_named_in_the_mismatch():
    """transformers' MoE counts tokens per expert with histc in float32 on CPU and int32 elsewhere: one graph
    per device type, which no normalisation can join. The mismatch names the dtypes and both devices, and the
    remedy is to plan the model as built where it runs (not the circular 'apply it to the model it was made
    for')."""
    plan = parallelizer.plan(parallelizer.trace(*families.mixtral(device="meta")), {"dp": 2})
    with pytest.raises(PlanMismatchError) as caught:
        parallelizer.check_plan(plan, parallelizer.trace(*families.mixtral(device="cpu")))
    text = str(caught.value)
    assert "node outputs of dtype int32: plan has 6, model has 2" in text
    assert "traced on meta, this one on cpu" in text and "device type it runs on" in text


@pytest.mark.distributed
def test_cli_plan_of_falcon_rehearses_on_two_ranks(tmp_path, capsys):
    """The README's flow: `parallelizer plan` (meta) then `parallelizer rehearse` (CPU ranks) on Falcon, whose
    plan used to fail on both ranks with UnsupportedOpError for `%lift_fresh_copy`."""
    out = tmp_path / "falcon.json"
    assert cli.main(["plan", "--model", "test_device_free:falcon", "--mesh", "tp=2", "--cluster", "h100:1x2",
                     "--no-progress", "-o", str(out)]) == 0
    assert cli.main(["rehearse", str(out), "--nproc", "2", "--timeout", "240"]) == 0
    assert "numerics match on 2 ranks" in capsys.readouterr().out


def test_a_plan_of_the_earlier_fingerprint_version_says_re_plan():
    """Plans saved before tracing became device-independent spell views as `aten.view` and keep export's node
    numbering: their mismatch says where they come from and to re-plan, before the node-by-node differences."""
    import dataclasses

    traced = parallelizer.trace(*BUILDERS["pattern_heads"]("cpu"))
    plan = parallelizer.plan(traced, {"dp": 2})
    view = next(n for n, node in plan.nodes.items() if node.op == "aten.reshape.default")
    old = dataclasses.replace(plan, fingerprint={**plan.fingerprint, "version": 1, "sha256": "0" * 64},
                              nodes={**plan.nodes, view: dataclasses.replace(plan.nodes[view], op="aten.view.default")})
    with pytest.raises(PlanMismatchError, match=r"earlier version of this toolkit \(fingerprint version 1, now 2"):
        parallelizer.check_plan(old, traced)
    parallelizer.check_plan(plan, traced)  # the plan of this version fits


def test_a_model_partly_on_meta_is_named_and_the_cli_build_moves_it():
    """A legacy constructor ignores `with torch.device("meta")`: the model was half on meta and export failed
    with a FakeTensorDeviceMismatchError at a line of the model (XLNet). `trace` names the tensors and the cause;
    the CLI's build moves such a model to meta, so `parallelizer plan` works on it."""
    from parallelizer import TraceError, presets

    with torch.device("meta"):
        model = LegacyParameter()
    with pytest.raises(TraceError, match=r"partly on the meta device") as caught:
        parallelizer.trace(model, (torch.randn(4, 8),))
    assert "2 parameter(s) / buffer(s) are on meta, 1 are not: scale (cpu)" in str(caught.value)
    built, args = presets.build({"factory": "test_device_free:legacy", "builder": None, "kwargs": {"batch": 4}})
    assert {p.device.type for p in built.parameters()} == {"meta"}
    assert parallelizer.trace(built, args).parameters["scale"].shape == (8,)


def test_cli_build_on_meta_keeps_tied_weights_tied_and_the_plan_fits_the_cpu_model():
    """A **kwargs factory got `device="meta"` (built on CPU, the device written into its config); then moving the
    legacy tensor to meta with `Module.to` untied the embedding and the head: the plan held two weights and
    `auto_parallelize(plan=...)` refused the real, tied model ("head.weight: in the plan, not in the model")."""
    from parallelizer import presets

    recipe = {"factory": "test_device_free:tied_kwargs", "builder": None, "kwargs": {"batch": 4}}
    model, args = presets.build(recipe, "meta")
    assert model.head.weight is model.emb.weight and {p.device.type for p in model.parameters()} == {"meta"}
    plan = parallelizer.plan(parallelizer.trace(model, args), {"dp": 2})
    cpu_model, cpu_args = presets.build(recipe, "cpu")
    parallelizer.check_plan(plan, parallelizer.trace(cpu_model, cpu_args), {"dp": 2})  # raises if not


class _StateWithoutDevice(nn.Module):
    """RWKV's recurrence state as users write it on CPU: `torch.zeros(B, C)` in forward, no device=."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        state = torch.zeros(x.shape[0], 8)
        return self.lin(x) + state


def test_a_tensor_made_in_forward_without_device_on_a_meta_model_gets_the_device_remedy():
    """Round 12 (r12b): `parallelizer plan` (the model on meta) of a forward making `torch.zeros(B, C)` said only
    "make forward traceable by torch.export(strict=False)", although it traces; the error now names the
    device= remedy (and planning the CPU model from Python)."""
    from parallelizer import TraceError

    with torch.device("meta"):
        model = _StateWithoutDevice()
    with pytest.raises(TraceError, match=r"made in forward on another device") as caught:
        parallelizer.trace(model, (torch.randn(4, 8, device="meta"),))
    assert "device=x.device" in str(caught.value) and "test_device_free.py" in str(caught.value)
    parallelizer.trace(_StateWithoutDevice(), (torch.randn(4, 8),))  # on CPU it traces


class _AutocastOff(nn.Module):
    """x-transformers' pattern (round 14, r14b): `with torch.autocast(x.device.type, enabled=False)` in forward,
    which raises 'unsupported scalarType' for device type 'meta', where `parallelizer plan` builds the model."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        with torch.autocast(x.device.type, enabled=False):
            return self.lin(x)


def test_an_error_raised_only_on_meta_gets_the_cpu_remedy():
    """Before: 'make forward traceable by torch.export(strict=False)', though the CPU model traces."""
    with pytest.raises(parallelizer.TraceError) as caught:
        parallelizer.trace(_AutocastOff().to("meta"), (torch.randn(2, 4, device="meta"),))
    assert "traced on the meta device" in str(caught.value) and "parallelizer.plan(parallelizer.trace(model" \
        in str(caught.value), str(caught.value)
    parallelizer.trace(_AutocastOff(), (torch.randn(2, 4),))  # on CPU it traces
