"""Export failures translated into TraceErrors that name the construct, the user's file:line and a remedy
(`translate`): data-dependent control flow and asserts on tensor values, random branch conditions, checks inside
torch's own module code (BatchNorm, torch.distributions, losses), code that takes another path when traced,
unsupported outputs, and errors the model itself raises."""
from __future__ import annotations

import inspect
import linecache
import os
import re
import traceback
from typing import Callable

import torch

from ..errors import TraceError
from . import packed
from .eager_check import data_reads
from .export_facts import device_cause, keyword_hint, signature_mismatch
from .watch import internal as _internal

_UNKNOWN_OUTPUT = re.compile(r"Found <class '([\w.]+)'> in output")
# torch.export's words when forward used `.data` (a tensor outside autograd becomes a fake constant)
_FAKE_CONSTANT = "fake tensor in the exported program constant"
_MODEL_ERRORS = (AttributeError, TypeError, ValueError, KeyError, IndexError, NameError, AssertionError)


_COMPILING = re.compile(r"\b(is_torchdynamo_compiling|is_compiling|is_exporting|is_dynamo_compiling)\s*\(")


def _tracing_branch(exc: BaseException) -> str | None:
    """`file:line: source` of a test of "am I being traced" (transformers' `is_torchdynamo_compiling()`,
    `torch.compiler.is_compiling()`) in a function of the user's code on the failing call stack, innermost
    first: such code runs another path under torch.export than eagerly (SwitchTransformers and LongT5 skip
    building their default attention mask: `if attention_mask is None and not is_torchdynamo_compiling():`),
    so an error there is not the model's eager error. Only such a skipped default (`is None` on the line, run
    before the failing call) counts: a test that only silences a warning changes nothing traced."""
    tb, frames = exc.__traceback__, []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        code = frame.f_code
        if _internal(code.co_filename):
            continue
        try:
            lines, start = inspect.getsourcelines(code)
        except (OSError, TypeError):
            continue
        for i, line in enumerate(lines):
            if _COMPILING.search(line) and " is None" in line and start + i <= frame.f_lineno:
                return f"{code.co_filename}:{start + i}: `{line.strip().rstrip(':')}`"
    return None


def translate(exc: Exception, eager: Callable[[], tuple[bool | None, Exception | None]] | None = None,
              on_meta: bool = False, model: torch.nn.Module | None = None,
              inputs: tuple[tuple, dict] = ((), {})) -> TraceError:
    """Turn an export failure into a TraceError naming the construct and the user's file:line. `eager` (asked
    only where the answer decides the cause: `eager_check.eager_outcome` on the same inputs, called at most once)
    tells a model that fails under export only (another path when traced) from one that fails eagerly too, with
    the eager error; `on_meta` (the model and inputs on the meta device, where no eager call tells) adds the CPU
    remedy to an otherwise unknown error; `model` and `inputs` (the args and kwargs given to export) are where
    the facts a cause names come from (devices, forward's signature), instead of the exception's text alone."""
    text = str(exc)
    location = _user_location(exc)
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    outcome: list[tuple[bool | None, Exception | None]] = []

    def eager_ran() -> tuple[bool | None, Exception | None]:
        if not outcome:
            outcome.append(eager() if eager is not None else (None, None))
        return outcome[0]

    cache_line = _cache_code_line(exc, model)
    if cache_line is not None:
        return TraceError(
            f"the model's key/value cache code, which runs because its config says use_cache=True (the default of "
            f"transformers' generative models): {cache_line[1]} `{cache_line[2]}` ({type(exc).__name__})",
            cache_line[0], "pass use_cache=False (in the config, or as a forward keyword) for the traced run: a "
            "training step does not read the cache", detail=first)
    mismatch = signature_mismatch(model, *inputs) if model is not None and isinstance(exc, TypeError) else None
    if mismatch:
        return TraceError(mismatch[0], None, mismatch[1], detail=first)
    if packed.in_failure(exc):
        return packed.packed_sequence_error(location, detail=first)
    branch = _tracing_branch(exc)
    if branch and "data-dependent" not in text and eager_ran()[0] is not False:
        # (an eager call that fails too is the model's error: a wrong input meets the same op on both paths)
        return TraceError(
            f"the model ({type(exc).__name__}): its code takes another path when traced than eagerly ({branch}: "
            "true under torch.export)", location,
            "pass the inputs that path leaves out explicitly (e.g. attention_mask=torch.ones_like(input_ids) when "
            "it skips building a default mask), so that the traced path is the eager one", detail=first)
    if "data-dependent" in text or "GuardOnDataDependent" in type(exc).__name__:
        library = _library_frame(exc)
        random_line = _random_condition(exc)
        checked = _assert_line(exc)
        value_line = _value_read_line(exc, library)
        # a random draw ahead of the branch (LayerDrop) has a config switch: that remedy, not a method replacement
        installed = library_check_remedy(exc, location) if not random_line else ""
        # torch's module code reading a value that an installed package's line passed in (ViLT's default config:
        # F.interpolate to sizes summed from pixel_mask in visual_embed): no module configuration of the user's
        # changes it, so the remedy names that package's method and its replacement (round 20, r20h)
        inside = _library_remedy(library) if library else ""
        if library and value_line and inside == _CONFIGURE_MODULE and installed_site(location):
            inside = library_value_remedy(exc, location)
        if checked:
            return TraceError(
                f"an assert on a tensor value (`{checked}`): a traced program cannot test a value it has not "
                "computed yet", location,
                installed + "remove the assert (or the check that raises) for the sharded run, or write it as "
                "torch._check(...) on the value (kept as a "
                "runtime check), or check the inputs outside forward", detail=first)
        return TraceError(
            (f"a tensor value read as a Python number or size (`{value_line}`: data-dependent, no branch)"
             if value_line else "data-dependent control flow (Python control flow on a tensor value)"), location,
            ("" if library else installed) + ("keep the value a tensor (multiply by the 0-dim tensor instead of its int() / float() / .item()), give "
             "sizes as Python ints (e.g. F.one_hot(x, num_classes=C)), or compute the number outside forward and "
             "pass it in as a Python value" if value_line and not library else "" if value_line else
             "branch with torch.where or torch.cond instead of `if tensor:`, or compute the condition "
             "outside forward and pass it in as a Python value")
            + (f"{'; here t' if not value_line else 'T'}he value is read inside torch's module code ({library}), "
               f"called from {'an installed package' if inside.startswith('the call is in') else 'your line'}: "
               + inside if library else "")
            + (f"; a random number drawn in forward precedes it in the same function ({random_line}): if the "
               "condition reads it, as LayerDrop's `torch.rand([]) < layerdrop` does, a traced program cannot draw "
               "a new branch each step, so turn it off for the sharded run (e.g. config.layerdrop=0.0)"
               if random_line and not value_line else ""), detail=first)
    unknown = _UNKNOWN_OUTPUT.search(text)
    if unknown:
        kind = unknown.group(1)
        cache = "Cache" in kind.rpartition(".")[2]
        return TraceError(
            f"an output of type {kind} (not a tensor, Python scalar or container of them)", location,
            ("pass use_cache=False and return no cache object from forward: a training step does not read it"
             if cache else "return tensors (or tuples/lists/dicts of them) from forward, or register the class "
             "with torch.utils._pytree.register_pytree_node (torch.export.register_dataclass for a dataclass)"),
            detail=first)
    if _FAKE_CONSTANT in text:
        reads = data_reads(model, *inputs) if model is not None else []
        return TraceError(
            "a tensor that forward takes out of autograd: `.data` of a parameter or buffer (e.g. "
            "`self.weight.data.clamp_(-c, c)`) or of an input or activation (`x.data`), which export cannot "
            "follow" + (f" (also read at {', '.join(reads[1:4])})" if len(reads) > 1 else ""),
            location or (reads[0] if reads else None),
            _data_read_remedy(reads[0] if reads else None) + "write it as `with torch.no_grad(): "
            "self.weight.clamp_(-c, c)` (an in-place write, kept) and read values with `.detach()` instead of "
            "`.data`", detail=first)
    if type(exc).__name__ == "FakeTensorDeviceMismatchError" and model is not None:
        construct, remedy = device_cause(text, model, *inputs)
        return TraceError(construct, location, remedy, detail=first)
    if type(exc).__name__ == "DynamicOutputShapeException" or "DynamicOutputShapeException" in text:
        op = next((line.strip() for line in text.splitlines() if line.strip().startswith("aten.")), "an op")
        known = next((remedy for key, remedy in _DYNAMIC_SHAPE_REMEDIES if key in op), None)
        selects = any(k in op for k in _SELECTING)
        return TraceError(
            f"an op whose output shapes depend on tensor values under export ({op})", location,
            library_call_remedy(location) + (known or ("replace the op by one with fixed output shapes (masking with torch.where instead of selecting)"
                      if selects else
                      f"{op} has no output shapes export can fix, whatever its arguments: compute it outside forward "
                      "on the model's outputs (for a loss: return what it reads and pass the loss as "
                      "pm.step(loss_fn=...)), or write it with ops of fixed shapes")),
            detail=first)
    statistic = _untraceable_statistic(exc, location)
    if statistic is not None:
        return TraceError(statistic[0], location, library_call_remedy(location) + statistic[1], detail=first)
    ran, eager_exc = eager_ran()
    if ran is True:
        return TraceError(
            f"the model ({type(exc).__name__}): it raises under torch.export but runs when called on the same "
            "inputs, so either its code takes another path when traced (e.g. transformers' masking_utils builds "
            "an attention mask under export that an eager call skips: Informer's ProbSparse and Autoformer's "
            "auto-correlation attention then reject its size) or export cannot follow an op it calls (the cause "
            "above says which)", location,
            "for another path, find the torch.compiler.is_compiling() / is_exporting() / torch.jit.is_tracing() "
            "test in the code the model calls and make both paths compute the same (pass the input that path "
            "builds, or a config that avoids it); otherwise make forward traceable by torch.export(strict=False). "
            "The parallel program can only be built from the exported one", detail=first)
    hint = keyword_hint(model, inputs[0]) if model is not None else ""
    eagerly = (f"model(*inputs) raises {type(eager_exc).__name__}: {_first_line(eager_exc)}" if ran is False
               else "not checked by an eager call: the model or its inputs are on the meta device or too large")
    if isinstance(exc, _MODEL_ERRORS) and _raised_outside_torch(exc):
        return TraceError(
            f"the model: its forward raised {type(exc).__name__} in code outside torch", location,
            (f"this is an error of the model's code, config or inputs, not of tracing ({eagerly}): run the model "
             "once eagerly on the example inputs and fix what it reports" if ran is False else
             f"an error of the model's code, config or inputs, unless that code runs only on a real device ({eagerly}):"
             " run the model once eagerly on CPU with the example inputs and fix what it reports") + hint,
            detail=first)
    if ran is False:
        return TraceError(
            f"the model ({type(exc).__name__}): it raises on these example inputs when called eagerly too ({eagerly})",
            location,
            "this is an error of the model's code, config or example inputs (their shapes, dtypes or number), not of "
            "tracing: run model(*inputs) once and fix what it reports, then trace again" + hint, detail=first)
    return TraceError(f"the model ({type(exc).__name__})", location,
                      ("the model was traced on the meta device (`parallelizer plan` builds it there), where no eager "
                       "call tells an error of the model or its example inputs (a shape, dtype or count forward does "
                       "not accept: see the cause above) from code that runs only on a real device (x-transformers' "
                       "`torch.autocast(x.device.type, enabled=False)`: 'unsupported scalarType'): build it on CPU and "
                       "call model(*inputs) once; if that runs, plan the CPU model from Python: "
                       "parallelizer.plan(parallelizer.trace(model, inputs), mesh); otherwise fix what it reports"
                       if on_meta else "make forward traceable by torch.export(strict=False); see the cause above")
                      + hint, detail=first)


_INSTALLED = re.compile(r"[\\/](?:site|dist)-packages[\\/]([^\\/]+)")


def installed_site(where: str | None) -> tuple[str, str, str, str] | None:
    """(package, file name, line number, source) when `where` ("file:line") lies in an installed package's code
    (a path under site-packages / dist-packages, e.g. transformers' modeling file), else None."""
    found = _INSTALLED.search(where or "")
    if found is None:
        return None
    path, _, line = where.rpartition(":")
    source = linecache.getline(path, int(line)).strip() if line.isdigit() else ""
    return found.group(1).partition(".")[0], os.path.basename(path), line, source


def library_call_remedy(where: str | None) -> str:
    """The start of a remedy when `where` ("file:line", `_user_line`) lies in an installed package's code
    (`installed_site`): the line and its source, and how to replace code the user cannot edit; "" for the user's
    own code. torch.export records a call's stack down to the innermost forward, so the line is often the CALL of
    the helper that selects (X-MOD: modeling_xmod.py:435 `hidden_states = self.lang_adapter(lang_ids,
    hidden_states)`, whose boolean index `hidden_states[lang_mask]` picks each language's samples; round 18)."""
    site = installed_site(where)
    if site is None:
        return ""
    package, name, line, source = site
    return (f"the op is made in the installed package {package} (not your code), in the call at "
            f"{name}:{line}" + (f" `{source}`" if source else "") + ": replace what that call runs "
            "with a fixed-shape version before tracing (a subclass of the module overriding the method, or the method "
            "assigned on the instance), e.g. run every branch on all rows and pick with torch.where(mask[:, None, None], "
            "branch(x), x) instead of x[mask]; or use a model or config of the package without it. In general: ")


def library_check_remedy(exc: BaseException, where: str | None) -> str:
    """The start of a remedy for an assert or a branch on a tensor value (`translate`'s data-dependent case) whose
    line `where` lies in an installed package's code, "" for the user's own code. The generic remedy (remove the
    assert, branch with torch.where) edits that code, which the user cannot: name the package, the function and
    line, and how to keep it out of the traced run. A check inside a seq2seq model's label shift (`_shift_right`:
    ProphetNet's and UDOP's `assert torch.all(shifted_input_ids >= 0).item()`) runs only because forward shifts
    `labels` itself when no `decoder_input_ids` are given, so passing them skips it (round 19, r19d; LED's and
    Longformer's `if is_global_attn:` on `.any().item()` have no such input: the method must be replaced)."""
    site = installed_site(where)
    if site is None:
        return ""
    package, name, line, source = site
    function = _installed_function(exc)
    text = (f"the check is in the installed package {package} (not your code), in {function}() at {name}:{line}"
            + (f" `{source}`" if source else "") + ": ")
    if "shift_right" in function:
        text += (f"it runs because forward shifts `labels` itself when no decoder_input_ids are given: pass "
                 f"decoder_input_ids=model.{function}(labels) (computed outside forward, before tracing; or your own "
                 "shift) together with labels=, and forward skips it. Otherwise: ")
    return text + (f"replace {function} for the traced run (a subclass overriding it, or the method assigned on the "
                   f"instance: `module.{function} = types.MethodType(fixed, module)`) with a version that keeps the "
                   "value a tensor (torch.where over both arms) or takes the branch from a Python value you know, or "
                   f"use a model or config of {package} without it. In your own code you would: ")


def _data_read_remedy(where: str | None) -> str:
    """The start of the `.data` remedy when the read `where` ("file:line", `eager_check.data_reads`) lies in an
    installed package's code, "" for the user's own: the line, the condition guarding it when the line above is an
    `if` (Gemma3n's AltUp clamp runs `if self.training and self.config.altup_coef_clip is not None`, a float field
    its config class refuses to set to None), and how to replace code the user cannot edit."""
    site = installed_site(where)
    if site is None:
        return ""
    package, name, line, source = site
    above = linecache.getline(where.rpartition(":")[0], int(line) - 1).strip()
    guard = f", under `{above}`" if above.startswith(("if ", "elif ")) else ""
    return (f"the read is in the installed package {package} (not your code), at {name}:{line}"
            + (f" `{source}`" if source else "") + guard + ": replace that method for the traced run (a subclass "
            "overriding it, or the method assigned on the instance: `module.method = types.MethodType(fixed, "
            "module)`) with the form below, or make its condition false (eval mode, or the config field it "
            "reads). In your own code: ")


_SELECTING = ("nonzero", "masked_select", "unique", "index", "argwhere")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


_BRANCH = re.compile(r"^(if|elif|while|assert)\b|\bif\b.*\belse\b|^return\b.*\b(and|or|not)\b")


def _value_read_line(exc: BaseException, library: str | None) -> str | None:
    """The innermost source line (torch's module code when `library` names it, else the user's) of a data-dependent
    failure when it is not a branch (`if` / `while` / `assert` / a conditional expression) but reads a tensor value
    as a Python number or size (`int(x.max())`, `F.one_hot(labels)`, BatchNorm's `float(num_batches_tracked)`),
    or None for a branch or an unknown line."""
    if library:
        line = library.split(": ", 1)[1] if ": " in library else ""
    else:
        user = [f for f in traceback.extract_tb(exc.__traceback__) if not _internal(f.filename)]
        line = (user[-1].line or "").strip() if user else ""
    if not line or _BRANCH.search(line):
        return None
    if line.startswith("raise ") or line.endswith(":"):
        return None
    return line


_DYNAMIC_SHAPE_REMEDIES = (  # ops whose fake kernel raises DynamicOutputShapeException though they select nothing
    ("lstsq", "torch.linalg.lstsq returns rank and singular values whose sizes export cannot fix, whatever the "
              "driver: write the solution as torch.linalg.pinv(A) @ B, or torch.linalg.solve(A.mT @ A, A.mT @ B) "
              "for a full-rank A"),
    ("ctc_loss", "torch's ctc_loss sizes its saved alignment table by the longest target, a value export cannot "
                 "fix (even for lengths given as Python ints), so a forward that computes CTC cannot be traced "
                 "(transformers' *ForCTC with labels=): compute it outside forward: return the log-probabilities "
                 "(or logits) from forward and "
                 "compute F.ctc_loss on what the parallel module returns, `loss = F.ctc_loss(pm(x).log_softmax(-1)"
                 ".transpose(0, 1), targets, input_lengths, target_lengths)` on every rank (the returned value is "
                 "whole on every rank, and its gradient goes back to each rank's part)"),
)
"""Per-op remedies for `DynamicOutputShapeException` where the generic one (mask instead of selecting) does not
apply (round 9 (b): lstsq; round 15 (r15a): ctc_loss, whose trace error told a CTC model to mask)."""


COV_CODE = ("xc = x - x.mean(dim=-1, keepdim=True); "
            "c = xc @ xc.transpose(-1, -2).conj() / (x.shape[-1] - 1)")
CORRCOEF_CODE = COV_CODE + "; d = c.diagonal().real.sqrt(); c = (c / d[:, None] / d[None, :]).clamp(-1, 1)"
"""Traceable torch.cov(x) (correction=1, no weights) and torch.corrcoef(x) of a 2-D x (rows the variables, columns
the observations), leaving the result in `c`: the formulas of torch's own docs (torch.cov: sum over observations of
(x - mean)(x - mean)^H / (N - correction); torch.corrcoef: cov / sqrt(diag outer diag), clamped to [-1, 1], as
ATen's corrcoef clips). tests/unit/test_trace_errors_statistics.py runs these strings against torch.cov / corrcoef."""

_STATISTICS = re.compile(r"\b(corrcoef|cov)\s*\(")


def _untraceable_statistic(exc: BaseException, location: str | None) -> tuple[str, str] | None:
    """(construct, remedy) when export failed with DataDependentOutputException on a line calling torch.cov /
    torch.corrcoef (or Tensor.cov / .corrcoef), else None. ATen's cov compares its weights' and observations'
    sums with values (`at::equal`, a `.item()` on the normalising factor) that fake tensors do not have, whatever
    the arguments (torch 2.13: 'DataDependentOutputException: aten.equal.default'; round 18 r18a refused both
    with the generic remedy)."""
    if "DataDependentOutput" not in type(exc).__name__ or location is None:
        return None
    path, _, line = location.rpartition(":")
    source = linecache.getline(path, int(line)) if line.isdigit() else ""
    found = _STATISTICS.findall(source)
    if not found:
        return None
    ops = sorted(set(found), reverse=True)  # ["cov"], ["corrcoef"] or ["cov", "corrcoef"]
    code = CORRCOEF_CODE if "corrcoef" in ops else COV_CODE
    op = " and torch.".join(ops)
    return (f"torch.{op} (aten.{', aten.'.join(ops)}): its ATen kernel reads tensor values to check its weights and normalising "
            "factor (aten.equal / .item()), which torch.export cannot follow on fake tensors, whatever the arguments",
            f"compute it from traceable ops, for a 2-D x (rows the variables, columns the observations; x.T of a "
            f"(batch, features) activation) and correction=1: `{code}` (the result is `c`; for another correction "
            "divide by (x.shape[-1] - correction)), or compute it outside forward on the model's outputs")


def _assert_line(exc: BaseException) -> str | None:
    """The source of the innermost user frame when it is an `assert` statement (ProphetNet's
    `assert torch.all(shifted_input_ids >= 0).item(), ...`: the remedy 'branch with torch.where' did not fit)."""
    user = [f for f in traceback.extract_tb(exc.__traceback__) if not _internal(f.filename)]
    line = (user[-1].line or "").strip() if user else ""
    if line.startswith("assert "):
        return line.split(",")[0]
    if line.startswith("if ") and line.endswith(":"):  # `if labels.max() >= vocab_size: raise ...` (Wav2Vec2ForCTC)
        following = linecache.getline(user[-1].filename, user[-1].lineno + 1).strip()
        if following.startswith("raise "):
            return line.rstrip(":") + ": raise"
    return None


def _raised_outside_torch(exc: BaseException) -> bool:
    """Whether the innermost frame of the traceback (where it was raised) is outside torch and this package."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and not _internal(frames[-1].filename)


def _installed_function(exc: BaseException) -> str:
    """The innermost function outside torch and this package in `exc`'s traceback, skipping comprehensions and
    lambdas (`<listcomp>`: ViLT's interpolation inside `torch.cat([... for h, w in zip(x_h, x_w)])`), whose name
    no subclass or method assignment can replace."""
    inner = [f for f in traceback.extract_tb(exc.__traceback__)
             if not _internal(f.filename) and not f.name.startswith("<")]
    return inner[-1].name if inner else "its function"


def library_value_remedy(exc: BaseException, where: str) -> str:
    """The remedy when torch's code reads a tensor value as a size or number (`translate`'s value case) that the
    line `where` of an installed package's code passed in: that package's function and line, replaced for the
    traced run by a version with Python-int sizes. `where` must satisfy `installed_site`."""
    package, name, line, source = installed_site(where)
    function = _installed_function(exc)
    return (f"the call is in the installed package {package} (not your code), in {function}() at {name}:{line}"
            + (f" `{source}`" if source else "") + f", which computes the size or number from tensor values: replace "
            f"{function} for the traced run (a subclass overriding it, or the method assigned on the instance: "
            f"`module.{function} = types.MethodType(fixed, module)`) with a version whose sizes are Python ints (from "
            f"the config and the input shapes), or use a model or config of {package} without it")


def _library_remedy(library: str) -> str:
    """What to change when torch's own code (`_library_frame`'s 'file:line: source') branched on a tensor."""
    if os.sep + "distributions" + os.sep in library or library.startswith("torch/distributions"):
        # Distribution.__init__ / log_prob check their arguments (`if not valid.all(): raise`) while
        # validate_args is on (the default outside `python -O`)
        return ("a torch.distributions object checks its arguments' values while validate_args is on (the "
                "default): pass validate_args=False to the distribution (Normal(loc, scale, validate_args=False)) "
                "or call torch.distributions.Distribution.set_default_validate_args(False) before tracing")
    if "adaptive.py" in library:  # AdaptiveLogSoftmaxWithLoss.forward gathers each cluster's rows by target value
        return ("AdaptiveLogSoftmaxWithLoss.forward routes each target to its cluster by value (sizes that depend on "
                "the targets), which no traced program can: call its log_prob(input) (every class, fixed shapes) and "
                "pick the targets' columns with gather, or compute the loss outside the model on the outputs")
    if "var < 0" in library:  # F.gaussian_nll_loss: `elif torch.any(var < 0): raise ValueError`
        return ("gaussian_nll_loss / GaussianNLLLoss checks `var >= 0` on the values, which has no switch: write "
                "the loss out, 0.5 * (var.clamp(min=eps).log() + (input - target) ** 2 / var.clamp(min=eps)) "
                "(+ 0.5 * log(2 * pi) with full=True), with your reduction")
    return _CONFIGURE_MODULE


_CONFIGURE_MODULE = ("change the module's configuration (e.g. BatchNorm's momentum=None reads num_batches_tracked "
                     "as a Python float: give momentum a number)")


def _library_frame(exc: BaseException) -> str | None:
    """`file:line: source` of the innermost frame in torch.nn's module code or torch.distributions after the
    user's last frame (a data-dependent read inside e.g. BatchNorm's forward, a distribution's argument
    check), or None when the user's code did it itself."""
    frames = traceback.extract_tb(exc.__traceback__)
    user = [i for i, f in enumerate(frames) if not _internal(f.filename)]
    lib_dirs = tuple(os.path.join(os.path.dirname(torch.__file__), d) + os.sep for d in ("nn", "distributions"))
    inner = [f for f in frames[(user[-1] + 1 if user else 0):]
             if f.filename.startswith(lib_dirs) and not f.filename.endswith("module.py")]
    if not inner:
        return None
    f = inner[-1]
    return f"{os.path.relpath(f.filename, os.path.dirname(os.path.dirname(torch.__file__)))}:{f.lineno}: {(f.line or '').strip()}"


_RANDOM_DRAW = re.compile(r"torch\.(rand|randn|randint|bernoulli|multinomial)\b|\brandom\.random\(|\blayerdrop\b")


def _random_condition(exc: BaseException, lines: int = 6) -> str | None:
    """'file:line: text' of a random draw in the `lines` source lines up to the user's failing line, inside the
    same function (LayerDrop draws `torch.rand([])` and branches on it a few lines later), or None. (Before, the
    window crossed the function's first line and named a draw of other code above it.)"""
    tb, user = exc.__traceback__, None
    while tb is not None:
        if not _internal(tb.tb_frame.f_code.co_filename):
            user = tb
        tb = tb.tb_next
    if user is None:
        return None
    filename, lineno = user.tb_frame.f_code.co_filename, user.tb_lineno
    first = max(lineno - lines, user.tb_frame.f_code.co_firstlineno, 1)
    for at in range(lineno, first - 1, -1):
        text = linecache.getline(filename, at).strip()
        if _RANDOM_DRAW.search(text):
            return f"{os.path.basename(filename)}:{at}: {text}"
    return None


def _cache_code_line(exc: BaseException, model: torch.nn.Module | None) -> tuple[str, str, str] | None:
    """(file:line, "file name:line", source) of the innermost frame of an installed package's code whose line
    handles a cache (the word "cache" in it) when the export failure passed through it and the model's config
    has `use_cache=True`, else None. Round 21 (r21e): Dory's default config copies its cache layers in forward
    (`cache.layers += [copy.deepcopy(c) ...]`, modeling_dory.py), which export cannot follow ("Cannot access data
    pointer of Tensor"), and the error named copy.py:153 and a remedy about paths taken under export, not
    use_cache=False (rule 10: a default configuration works or the error names the option)."""
    if getattr(getattr(model, "config", None), "use_cache", False) is not True:
        return None
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        where = f"{frame.filename}:{frame.lineno}"
        site = installed_site(where)
        if site is not None and site[0] != "torch" and "cache" in (frame.line or "").lower():
            return where, f"{site[1]}:{site[2]}", (frame.line or "").strip()
    return None


def _user_location(exc: BaseException) -> str | None:
    """file:line of the innermost frame outside torch and this package, from the traceback."""
    user = [f for f in traceback.extract_tb(exc.__traceback__) if not _internal(f.filename)]
    if not user:
        return None
    return f"{user[-1].filename}:{user[-1].lineno}"
