"""Rank bodies for test_export_contract: getting a trained model out of a ParallelModule, as users do after training.

Every check compares with the eager model on one device, built from the same seed in the same rank and trained with
the same steps. Functions return plain values (messages, booleans, numbers, warning texts) that the test asserts.
"""
from __future__ import annotations

import copy
import os
import warnings

import torch
import torch.distributed as dist

import parallelizer
from parallelizer import zoo
from parallelizer.errors import StaleModelWarning, StateDictError

ROLES = {"tp2": ({"tp": 2}, {"tp": "tp"}), "fsdp2": ({"dp": 2}, {"dp": "fsdp"}), "ddp2": ({"dp": 2}, {"dp": "ddp"})}


def _model():
    return zoo.hf.gpt2(batch=4, seq_len=8, labels=True, n_embd=32, vocab_size=50)


def _ids(step: int) -> torch.Tensor:
    return torch.randint(0, 50, (4, 8), generator=torch.Generator().manual_seed(100 + step))


def _train(m, opt, steps) -> None:
    for s in steps:
        ids = _ids(s)
        m(ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()


def _trained(name: str):
    """(model, pm, opt, eager) after 2 AdamW steps on pm and on the eager copy."""
    model, (ids,), kw = _model()
    eager = copy.deepcopy(model)
    mesh, roles = ROLES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NoParallelismWarning and the solver's notes
        pm = parallelizer.auto_parallelize(model, (ids,), mesh=mesh, axis_roles=roles, example_kwargs=kw)
    opt, eager_opt = (torch.optim.AdamW(m.parameters(), lr=1e-2, eps=1e-5) for m in (pm, eager))
    _train(pm, opt, range(2))
    _train(eager, eager_opt, range(2))
    return model, pm, opt, eager, eager_opt


def _stale(fn) -> tuple[object, list[str]]:
    """fn()'s value and the StaleModelWarnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = fn()
    return value, [str(w.message) for w in caught if issubclass(w.category, StaleModelWarning)]


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().double() - b.detach().double()).abs().max().item()


def model_attributes(rank: int, world_size: int, names: list[str]) -> dict:
    """Per plan: the model's methods and attributes read on pm -> (error class, message); hasattr(pm, 'generate');
    an attribute the model lacks too -> its error class."""
    out = {}
    for name in names:
        _, pm, _, _, _ = _trained(name)
        r = {}
        for attr in ("save_pretrained", "generate", "config"):
            try:
                getattr(pm, attr)
                r[attr] = ("no error", "")
            except AttributeError as exc:
                r[attr] = (type(exc).__name__, str(exc))
        r["hasattr generate"] = hasattr(pm, "generate")
        try:
            pm.no_such_attribute
        except AttributeError as exc:
            r["unknown"] = type(exc).__name__
        out[name] = r
    return out


def export_recipe(rank: int, world_size: int, names: list[str], directory: str) -> dict:
    """Per plan, after 2 steps:
    "recipe": model.load_state_dict(pm.full_state_dict()), model.save_pretrained, model.eval(), generate, from_pretrained:
        (warnings, max |logits - eager's| of the loaded model, generated tokens equal to eager's);
    "next step": pm trains one more step after the recipe -> warnings at its forward;
    "stale again": model.save_pretrained after that step, without loading pm's weights again -> warnings (the model
        is behind pm again: what a script saving the original model after training gets)."""
    from transformers import GPT2LMHeadModel

    out = {}
    for name in names:
        model, pm, opt, eager, eager_opt = _trained(name)
        r = {}
        where = os.path.join(directory, name)  # transformers writes on rank 0 only in a distributed job
        ids = _ids(9)

        def recipe():
            model.load_state_dict(pm.full_state_dict())
            model.save_pretrained(where)
            model.eval()  # for generation; pm keeps its own mode
            tokens = model.generate(ids[:, :4], max_new_tokens=4, do_sample=False)
            return tokens

        tokens, warned = _stale(recipe)
        dist.barrier()
        loaded = GPT2LMHeadModel.from_pretrained(where)
        expected = eager.generate(ids[:, :4], max_new_tokens=4, do_sample=False)
        r["recipe"] = (warned, _diff(loaded(ids).logits, eager(ids).logits), bool(torch.equal(tokens, expected)))
        _, r["next step"] = _stale(lambda: _train(pm, opt, range(2, 3)))
        _, r["stale again"] = _stale(lambda: model.save_pretrained(where + "-stale"))
        dist.barrier()
        out[name] = r
    return out


def one_device_resume(rank: int, world_size: int, names: list[str]) -> dict:
    """Per plan, after 2 steps: the model on one device loads pm.full_state_dict(), and a new AdamW over it loads this
    rank's opt.state_dict() (a rank's pieces), then steps: "refused" with the StateDictError's message and whether
    nothing moved, or "stepped" with max |param - eager's| after eager's own third step (from its own state)."""
    out = {}
    for name in names:
        _, pm, opt, eager, eager_opt = _trained(name)
        one, _, _ = _model()
        one.load_state_dict(pm.full_state_dict())
        one_opt = torch.optim.AdamW(one.parameters(), lr=1e-2, eps=1e-5)
        one_opt.load_state_dict(opt.state_dict())
        ids = _ids(2)
        one(ids, labels=ids).loss.backward()
        before = [p.detach().clone() for p in one.parameters()]
        try:
            one_opt.step()
        except StateDictError as exc:
            out[name] = ("refused", str(exc), all(torch.equal(a, b) for a, b in zip(before, one.parameters())))
            continue
        except RuntimeError as exc:  # torch's own error (the behaviour before the check)
            out[name] = ("raw", str(exc), None)
            continue
        _train(eager, eager_opt, range(2, 3))
        out[name] = ("stepped", max(_diff(a, b) for a, b in zip(one.parameters(), eager.parameters())), None)
    dist.barrier()
    return out


def cast_after_wrapping(rank: int, world_size: int) -> dict:
    """Parameters cast after wrapping, as for a low-precision evaluation or export after training:
    "pipeline full": pp=2 GPT-2 after pm.to(bfloat16): max |full_state_dict() - eager's bf16 state_dict()| (and the
        dtypes it holds); "pipeline step": the next pm.step -> error class and message;
    "tp2 forward": tp=2 GPT-2 after pm.to(bfloat16): a forward -> error class and message;
    "int input double": Embedding -> Linear -> GELU -> Linear (every op follows its inputs' dtype) on tp=2 after
        pm.double(), token ids in: max |pm(ids) - eager's float64 model(ids)| (it ran before and still runs)."""
    out = {}
    model, (ids,), kw = _model()
    eager = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = parallelizer.auto_parallelize(model, (ids,), mesh={"pp": 2}, example_kwargs=kw)
    pm.to(torch.bfloat16)
    eager.to(torch.bfloat16)
    full, reference = pm.full_state_dict(), eager.state_dict()
    out["pipeline full"] = (max(_diff(full[k], reference[k]) for k in reference), sorted({str(v.dtype) for v in full.values()}))
    try:
        pm.step(ids, **kw)
        out["pipeline step"] = ("ran", "")
    except Exception as exc:  # noqa: BLE001 - the class is what is checked
        out["pipeline step"] = (type(exc).__name__, str(exc))
    dist.barrier()
    _, pm, _, _, _ = _trained("tp2")
    pm.to(torch.bfloat16)
    try:
        pm(_ids(5), labels=_ids(5))
        out["tp2 forward"] = ("ran", "")
    except Exception as exc:  # noqa: BLE001
        out["tp2 forward"] = (type(exc).__name__, str(exc))
    dist.barrier()
    torch.manual_seed(0)
    small = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 32), torch.nn.GELU(),
                                torch.nn.Linear(32, 4))
    eager_small = copy.deepcopy(small).double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = parallelizer.auto_parallelize(small, (_ids(0),), mesh={"tp": 2}, axis_roles={"tp": "tp"})
    pm.double()
    out["int input double"] = _diff(pm(_ids(1)), eager_small(_ids(1)))
    return out
