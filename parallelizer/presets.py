"""Named models for the CLI and the demo, as JSON-able recipes (no code is ever stored in a plan).

A recipe is {"preset": name, "builder": zoo builder, "kwargs": {...}} or {"factory": "package.module:fn",
"kwargs": {...}}; `build(recipe, device)` turns it into `(model, example_inputs)`, and the plan keeps the
recipe (`Plan.model["recipe"]`) so that `parallelizer rehearse plan.json` can rebuild the model.

Presets: the zoo's small defaults under their family names for `mlp` and `gpt` (in-repo toys; `gpt` with
targets, so its loss is traced); published
sizes for `gpt2` (= gpt2-small, Radford et al. 2019: 12 layers, 768 hidden, 12 heads, vocab 50257),
gpt2-medium/-large/-xl (24/1024/16, 36/1280/20, 48/1600/25), `llama` (= llama2-7b, Touvron et al. 2023,
Table 1), `bert` (= bert-base, Devlin et al. 2019: 12/768/12, vocab 30522) and `vit` (= vit-base,
Dosovitskiy et al. 2021: 12/768/12, 224 px, patch 16). The language models (gpt, gpt2*, llama*) are traced
with labels (logits and loss in the graph), returning the loss alone (`--config returns=all`: transformers'
whole output, the logits too), and the gpt2/llama ones with SDPA attention (`_LM`). `--config` overrides any config field; a key that is
not one (`check_config`: for transformers presets an attribute of the default config class, for the in-repo
models a builder or config-dataclass parameter, for a factory a parameter unless it takes **kwargs) raises
`UnknownConfigKeyError` naming the closest valid key (transformers configs would silently accept it).

`reduced(recipe, world_size)` keeps the structure (layer count, GQA or not, tied weights) and shrinks widths,
heads, vocabulary, batch and sequence so that every dim is a multiple of the device count: the plan's node
names stay the same (they depend on structure only) and every sharded dim stays divisible.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import math
import re

import torch

from . import zoo
from .errors import ParallelizerError


class UnknownConfigKeyError(ParallelizerError, ValueError):
    """A --config key the model does not take. Attributes: key, model, suggestion (closest valid key or None)."""

    def __init__(self, key: str, model: str, valid: list[str]) -> None:
        self.key, self.model = key, model
        close = difflib.get_close_matches(key, valid, n=1)
        self.suggestion = close[0] if close else None
        hint = f" (did you mean {self.suggestion!r}?)" if close else ""
        listed = f"; valid keys: {', '.join(sorted(valid))}" if len(valid) <= 20 else ""
        super().__init__(f"unknown --config key {key!r} for model {model}{hint}{listed}. Remedy: use a field of "
                         f"the model's config{f', e.g. {self.suggestion}=...' if close else ''}")


class ModelBuildError(ParallelizerError):
    """Building the model from its recipe raised. Attributes: model, config (the kwargs), cause (the exception)."""

    def __init__(self, model: str, config: dict, cause: BaseException, device: str = "meta") -> None:
        self.model, self.config, self.cause = model, config, cause
        text = " ".join(f"{type(cause).__name__}: {cause}".split())
        text = text if len(text) <= 300 else text[:300] + "..."
        # the cause as far as the facts tell it: no config to blame when none was given (round 15, r15f: "fix that
        # --config value" for a factory called with {}), and a factory that reads a tensor value while building
        # (`.item()`, `.tolist()`) fails on meta only, where `parallelizer plan` builds it
        on_meta = device == "meta" and re.search(r"\bmeta (tensor|device)", str(cause)) is not None
        remedy = ("the cause names meta tensors: the factory fails on the meta device `parallelizer plan` builds on "
                  "(shapes only), e.g. reading a value of a tensor it made (`.item()`, `.tolist()`, numpy), which a "
                  "meta tensor does not have: give the factory a `device` parameter and make such values on CPU, or "
                  "plan the CPU model from Python: parallelizer.plan(parallelizer.trace(model, inputs), mesh)"
                  if on_meta else
                  "fix the --config value (or the batch / seq_len) the cause names" if config else
                  "the builder raised with its default arguments (no --config given): fix the factory")
        super().__init__(f"building model {model} with config {config} failed (on the {device} device): {text}\n"
                         f"Remedy: {remedy}, or build the model in Python to see the full traceback")

# Language-model presets are traced as they train: with labels, so the logits and the loss (cross-entropy over
# the vocabulary, the largest activation of a small model) are part of the graph and of its memory, returning the
# loss alone (returns="loss", `zoo.hf.loss_only`: a training step reads nothing else, and returned logits are
# gathered whole on every rank: a Llama-3-8B shape's 134.5 GB per rank on dp=8 x tp=8, round 14; `--config
# returns=all` plans transformers' whole output); and with PyTorch's scaled-dot-product attention (transformers'
# default "sdpa", one fused kernel: no s x s matrix), not the eager attention the zoo builders default to for CPU
# numerics.
_LM = dict(labels=True, returns="loss", attn_implementation="sdpa")
_GPT2 = dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, **_LM)
PRESETS: dict[str, tuple[str, dict]] = {
    "mlp": ("mlp", {}),
    "gpt": ("gpt", {"with_targets": True}),
    "gpt2": ("gpt2", _GPT2),
    "gpt2-small": ("gpt2", _GPT2),
    "gpt2-medium": ("gpt2", dict(_GPT2, n_layer=24, n_embd=1024, n_head=16)),
    "gpt2-large": ("gpt2", dict(_GPT2, n_layer=36, n_embd=1280, n_head=20)),
    "gpt2-xl": ("gpt2", dict(_GPT2, n_layer=48, n_embd=1600, n_head=25)),
    "llama": ("llama", {**zoo.llama2_7b_config(), **_LM}),
    "llama2-7b": ("llama", {**zoo.llama2_7b_config(), **_LM}),
    "bert": ("bert", dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                          vocab_size=30522)),
    "vit": ("vit", dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                        image_size=224, patch_size=16)),
}
PRESETS["bert-base"], PRESETS["vit-base"] = PRESETS["bert"], PRESETS["vit"]


def recipe(model: str, config: dict | None = None, batch: int | None = None, seq_len: int | None = None) -> dict:
    """The recipe of a preset name or a "package.module:factory" with config overrides, batch and seq_len.

    Raises:
        ValueError: unknown preset (lists them), or --seq-len for a model without a sequence (vit, mlp).
        UnknownConfigKeyError: a config key the model does not take (`check_config`).
    """
    config = dict(config or {})
    check_config(model, config)
    if ":" in model:
        kwargs = dict(config)
        fn = _factory(model)
        for key, value in (("batch", batch), ("seq_len", seq_len)):
            if value is not None and _accepts(fn, key):
                kwargs[key] = value
        return {"factory": model, "kwargs": kwargs}
    if model not in PRESETS:
        raise ValueError(f"unknown model {model!r}: use a preset ({', '.join(sorted(PRESETS))}) or "
                         "'package.module:factory' returning (model, example_inputs) or a model")
    builder, base = PRESETS[model]
    kwargs = {**base, **config}
    fn = zoo.BUILDERS[builder]
    if batch is not None:
        kwargs["batch"] = batch
    if seq_len is not None:
        if not _accepts(fn, "seq_len"):
            raise ValueError(f"model {model!r} has no sequence length: drop --seq-len")
        kwargs["seq_len"] = seq_len
    return {"preset": model, "builder": builder, "kwargs": kwargs}


def build(recipe: dict, device: str = "meta") -> tuple:
    """`(model, example_inputs)` or `(model, example_inputs, example_kwargs)` of a recipe on `device` ("meta":
    shapes only; "cpu": seeded random weights), ready for `trace(*build(recipe))`.

    A factory with a parameter named `device` gets it; otherwise (also one taking only `**kwargs`, which used to
    get `device=` and pass it into a config, building the whole model on CPU) it runs under
    `torch.device(device)`. On "meta" what is left elsewhere is then moved there, tied tensors staying tied
    (legacy constructors such as `torch.FloatTensor(...)`, XLNet's, ignore the context). It may
    return `(model, args)`, `(model, args, kwargs)` (keyword inputs, e.g. labels=) or only a transformers
    model, which then gets token ids (batch, seq_len) from `config.vocab_size`.
    Raises:
        ValueError: the factory cannot be imported, or returned something else than the forms above (remedy).
        ModelBuildError: the builder or factory raised (bad config value, a bug in the factory): one line
            naming the model, its config and the cause, plus a remedy.
    """
    kwargs = dict(recipe["kwargs"])
    fn = zoo.BUILDERS[recipe["builder"]] if "factory" not in recipe else _factory(recipe["factory"])
    try:
        if "factory" not in recipe:
            return fn(device=device, **kwargs)
        if _accepts(fn, "device", var_keyword=False):
            out = fn(device=device, **kwargs)
        else:
            with torch.device(device):
                out = fn(**kwargs)
        model = out[0] if isinstance(out, tuple) and out else out
        if device == "meta" and isinstance(model, torch.nn.Module):
            to_meta(model)  # what a legacy constructor (torch.FloatTensor(...)) made outside the context
    except Exception as exc:
        raise ModelBuildError(recipe.get("preset") or recipe.get("factory") or recipe["builder"], kwargs, exc,
                              device) from exc
    if isinstance(out, tuple) and len(out) in (2, 3) and isinstance(out[0], torch.nn.Module) \
            and (len(out) == 2 or isinstance(out[2], dict)):
        model, inputs, *kwargs = out
        return (model, inputs if isinstance(inputs, tuple) else (inputs,), *kwargs)
    vocab = getattr(getattr(out, "config", None), "vocab_size", None)
    if isinstance(out, torch.nn.Module) and vocab:
        ids = torch.randint(0, vocab, (kwargs.get("batch", 2), kwargs.get("seq_len", 32)),
                            generator=torch.Generator().manual_seed(0))
        return out, (ids.to(device),)
    raise ValueError(f"factory {recipe['factory']} returned {type(out).__name__}: return (model, example_inputs), "
                     "(model, example_inputs, example_kwargs) with a dict of keyword inputs, or a transformers "
                     "model with config.vocab_size (token-id inputs are then made for it)")


def build_cpu(**recipe) -> tuple:
    """`build(recipe, "cpu")` as a module-level `model_fn(**kwargs)` for `runtime.rehearsal.rehearse`."""
    return build(recipe, "cpu")


def reduced(recipe: dict, world_size: int) -> dict:
    """The recipe at reduced width with the same structure (module docstring).

    Raises:
        ValueError: a factory recipe (its config keys are unknown: rehearse it at its own width or pass a
            smaller --config when planning).
    """
    if "factory" in recipe:
        raise ValueError(f"cannot shrink factory model {recipe['factory']}: its config keys are unknown. Remedy: "
                         "plan it with a small --config, then rehearse at real width (--width real)")
    w = world_size
    up = lambda n: w * math.ceil(n / w)  # noqa: E731 - smallest multiple of w that is >= n
    heads = up(4)
    hidden, vocab, batch, seq = 16 * heads, up(256), up(4), up(16)
    kw = dict(recipe["kwargs"])
    b = recipe["builder"]
    if b == "gpt2":
        kw.update(n_embd=hidden, n_head=heads, vocab_size=vocab, n_positions=max(64, seq))
        kw.pop("n_inner", None)
    elif b == "gpt":
        kw.update(n_embd=hidden, n_head=heads, vocab_size=vocab, block_size=seq)
    elif b == "llama":
        gqa = kw.get("num_key_value_heads", kw.get("num_attention_heads")) != kw.get("num_attention_heads")
        heads = 2 * up(2) if gqa else heads
        hidden = 16 * heads
        kw.update(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=heads // 2 if gqa else heads,
                  intermediate_size=up(3 * hidden), vocab_size=vocab, max_position_embeddings=max(64, seq))
    elif b in ("bert", "vit"):
        kw.update(hidden_size=hidden, num_attention_heads=heads, intermediate_size=4 * hidden)
        if b == "bert":
            kw.update(vocab_size=vocab, max_position_embeddings=max(64, seq))
        else:
            kw.update(image_size=32, patch_size=8)
    elif b == "mlp":
        kw.update(in_features=up(8), dim=up(16), hidden=up(64), out_features=up(4))
    if "batch" in kw or b in ("mlp", "vit"):
        kw["batch"] = batch
    if "seq_len" in kw:
        kw["seq_len"] = seq
    return {**recipe, "kwargs": kw}


_HF_CONFIGS = {"gpt2": "GPT2Config", "llama": "LlamaConfig", "bert": "BertConfig", "vit": "ViTConfig"}


def check_config(model: str, config: dict) -> None:
    """Raise `UnknownConfigKeyError` for the first key of `config` that `model` (a preset or
    "package.module:factory") does not take (module docstring); a factory with **kwargs takes any key.
    "device" is never a config key (`build` passes it)."""
    if not config:
        return
    hf = None
    if ":" in model:
        try:
            params = inspect.signature(_factory(model)).parameters
        except (TypeError, ValueError):
            return
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return
        names = set(params)
    elif model in PRESETS:
        builder = PRESETS[model][0]
        names = {n for n, p in inspect.signature(zoo.BUILDERS[builder]).parameters.items()
                 if p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)}
        if builder == "gpt":
            names |= {f.name for f in dataclasses.fields(zoo.GPTConfig)}
        elif builder == "mlp":
            names |= set(inspect.signature(zoo.MLP).parameters)
        elif builder in _HF_CONFIGS:
            import transformers
            hf = getattr(transformers, _HF_CONFIGS[builder])()
            names |= set(vars(hf)) | set(getattr(hf, "attribute_map", {}))
    else:
        return  # unknown preset: recipe() says so
    names.discard("device")
    for key, value in config.items():
        if key in names or (hf is not None and key != "device" and not key.startswith("_") and hasattr(hf, key)
                            and not callable(getattr(hf, key))) or _sets_a_config_field(hf, key, value):
            continue
        raise UnknownConfigKeyError(key, model, sorted(n for n in names if not n.startswith("_")))


def _sets_a_config_field(hf, key: str, value) -> bool:
    """Whether a transformers config class takes `key` as a legacy alias that it stores under another field
    (transformers 5 reads Llama 3's `rope_theta=500000.0` into `rope_parameters`): building the config with it
    changes a field of the default config. An unknown key only adds itself (transformers keeps any key); a
    value the class rejects shows that it read the key, and the build names the cause."""
    if hf is None or key == "device" or key.startswith("_") or callable(getattr(hf, key, None)):
        return False
    default = hf.to_dict()
    try:
        changed = type(hf)(**{key: value}).to_dict()
    except Exception:  # noqa: BLE001 - the class read the key: the build reports the value (ModelBuildError)
        return True
    return any(k != key and k in default and changed[k] != default[k] for k in changed)


def _factory(spec: str):
    module, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import model factory {spec!r} ({exc}); use 'package.module:function' with the "
                         "package importable (on sys.path / installed)") from exc




def to_meta(model: torch.nn.Module) -> torch.nn.Module:
    """Move the parameters and buffers of `model` that are not on meta there, in place, one new tensor per tensor,
    so that tied weights stay one tensor; returns `model`. `Module.to("meta")` and `to_empty(device="meta")` make
    a new Parameter per owning module and untie them (torch 2.13): the plan then held two weights where the model
    has one, and no longer fit it. The remedy `trace` names for a model partly on meta (a legacy constructor such
    as `torch.Tensor(...)`, XLNet's, FastSpeech2-Conformer's, ignores `with torch.device("meta")`) or for an example
    input on another device than the model when tracing shapes only."""
    moved: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for store in (module._parameters, module._buffers):
            for name, tensor in store.items():
                if tensor is None or tensor.is_meta:
                    continue
                if id(tensor) not in moved:
                    new = torch.empty_like(tensor, device="meta")
                    moved[id(tensor)] = torch.nn.Parameter(new, tensor.requires_grad) \
                        if isinstance(tensor, torch.nn.Parameter) else new
                store[name] = moved[id(tensor)]
    return model


def _accepts(fn, name: str, var_keyword: bool = True) -> bool:
    """Whether `fn` takes keyword `name`: a parameter so named, or (with `var_keyword`) `**kwargs`. A factory gets
    `device=` only for a parameter so named (a `**kwargs` factory used to pass it into a config)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or (var_keyword and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()))
