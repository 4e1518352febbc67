"""Typed errors of the toolkit (DESIGN.md rule 5).

Every error message names what failed (node, op, shapes, mesh), and says what to do about it. The classes
carry the structured pieces as attributes too, so notebooks and the CLI can show them without parsing text.
"""
from __future__ import annotations


class ParallelizerError(Exception):
    """Base class of every error raised by the toolkit on bad input or an impossible request."""


class TraceError(ParallelizerError):
    """The model could not be captured as one graph.

    Attributes:
        construct: short name of what could not be captured (e.g. "data-dependent control flow").
        location: "file:line" of the user's source that triggered it, or None when unknown.
        remedy: what the user can change so that tracing succeeds.
    """

    def __init__(self, construct: str, location: str | None, remedy: str, detail: str = "") -> None:
        self.construct = construct
        self.location = location
        self.remedy = remedy
        where = f" at {location}" if location else ""
        text = f"cannot trace {construct}{where}."
        if detail:
            text += f"\n{detail}"
        text += f"\nRemedy: {remedy}"
        super().__init__(text)


class UnsupportedOpError(ParallelizerError):
    """An operator has no sharding rule and no recorded fallback is allowed for it."""


class InfeasiblePlanError(ParallelizerError):
    """No plan satisfies the constraints (e.g. the per-device memory budget)."""


class PrecisionError(ParallelizerError, ValueError):
    """A precision the traced graph or the device cannot be priced in (e.g. "bf16" on a calibrated CPU
    without a bf16 peak, or "fp32" for a graph traced with bf16 parameters); the message gives the remedy."""


class PlanMismatchError(ParallelizerError):
    """A plan was made for another model, input shapes or mesh than the one it is applied to."""


class InputMismatchError(PlanMismatchError, TypeError):
    """A call of a traced program whose inputs are not the traced call's: another structure (a tuple where a
    tensor was traced, a keyword not traced) or a non-tensor where a tensor was traced. A TypeError too, as a
    function called with the wrong arguments raises (before round 15 it was a plain TypeError)."""


class ConstantInputError(PlanMismatchError, ValueError):
    """A non-tensor input (a flag, a scale) whose value differs from the traced one: it is a constant of the traced
    graph. A ValueError too (before round 15 it was a plain ValueError)."""


class StateDictError(ParallelizerError, RuntimeError):
    """A state dict does not fit the model: keys missing or unexpected, or a tensor of another shape.
    A RuntimeError too, as `nn.Module.load_state_dict` raises for the same mistakes.

    Attributes: missing, unexpected: the key lists (empty for a shape mismatch).
    """

    def __init__(self, message: str, missing: list[str] | None = None, unexpected: list[str] | None = None) -> None:
        self.missing, self.unexpected = list(missing or ()), list(unexpected or ())
        super().__init__(message)


class OptimizerError(ParallelizerError, TypeError):
    """An optimizer whose update of a local shard (or of one rank's stage parameters) is not that part of the
    single-device update; the message names the optimizer, its kind, a parameter, its layout and the remedy.

    Attributes: optimizer (class name), kind ("per-tensor", "coupled" or "partitioned": it broadcasts whole
    parameters between ranks, as ZeroRedundancyOptimizer does), parameter (FQN).
    """

    def __init__(self, message: str, optimizer: str, kind: str, parameter: str) -> None:
        self.optimizer, self.kind, self.parameter = optimizer, kind, parameter
        super().__init__(message)


class WrapperError(ParallelizerError, TypeError):
    """A torch wrapper that synchronises or shards parameters itself (DistributedDataParallel, FSDP) applied to
    a module holding a ParallelModule's or PipelineModule's parameters; the message names the wrapper, a
    parameter and the remedy (use the parallel module directly: its plan already does data parallelism)."""


class ModelAttributeError(ParallelizerError, AttributeError):
    """An attribute of the wrapped model's own class or instance (`save_pretrained`, `generate`, `config`) read on
    the parallel module, which holds this rank's pieces and runs the traced forward only; the message names the
    attribute, the model's class and the remedy. An AttributeError too, so `hasattr(pm, name)` stays False."""


class PlanValidationError(ParallelizerError, ValueError):
    """A plan file is not valid JSON or violates the plan schema (`parallelizer/plan_schema.json`).

    Attributes:
        path: the JSON path of the offending field, e.g. "params/h.0.c_fc.weight/shape/0" ("" = the document).
    """

    def __init__(self, message: str, path: str = "") -> None:
        self.path = path
        super().__init__(message)


class UnknownNodeError(ParallelizerError, KeyError):
    """A node name that is not in the traced graph or plan; the message lists the closest names."""

    def __init__(self, name: str, where: str, known) -> None:
        import difflib

        close = difflib.get_close_matches(name, list(known), n=5, cutoff=0.6)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        self.name = name
        super().__init__(f"no node {name!r} in {where}{hint} (node names are the fx names of the traced graph, "
                         "e.g. from plan.summary() or traced.nodes)")

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return self.args[0]


def format_bytes(n: float) -> str:
    """Bytes in decimal units, precise at any scale: 512 B, 3.2 kB, 41.3 GB (1 GB = 1e9 bytes)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


class ConfigError(ParallelizerError, ValueError):
    """An option of `parallelizer.plan` / `PlanConfig` / `auto_parallelize` outside its values: an unknown axis
    role, precision, optimizer or solver, a malformed mesh or cluster string, a batch / microbatch count that does
    not fit the traced graph. The message names the option, the value given and the values allowed. A
    ValueError too, so code catching ValueError keeps working (round 18: these were bare ValueErrors, which README
    section 7's "every error is a ParallelizerError" did not hold for)."""


class GradNormError(ParallelizerError, ValueError):
    """torch's `clip_grad_norm_` / `get_total_norm` over tensors of which no one global norm can be formed: shards
    of a ParallelModule mixed with other tensors or another mesh, or a part of a PipelineModule's gradients that
    leaves out some gradient (a pipeline rank holds only its stages). The message gives the remedy. A ValueError
    too, as before round 19 (trial g: it was a bare ValueError)."""


class PipelineError(ParallelizerError, ValueError):
    """A pipeline request that cannot be cut or scheduled: a "pp" axis that is not outermost, a stage count
    that does not divide the repeated blocks, an unknown schedule, or microbatches < 1 (the message names
    the value and the remedy)."""


class MicrobatchWarning(UserWarning):
    """Warned by `auto_parallelize` when a pipeline plan's microbatches change what the model computes: a module's
    outputs on the whole batch differ from its outputs on the microbatches one at a time (its forward mixes the
    samples of the batch: BatchNorm statistics in training, a mean over the batch dim), or a buffer written in
    forward ends elsewhere (updated once per microbatch instead of once per batch). The pipeline then trains as
    gradient accumulation over the microbatches does, not as the model on the whole batch
    (`tracer.microbatch_check`). Attribute `where`: the module or buffer named."""

    def __init__(self, message: str, where: str = ""):
        super().__init__(message)
        self.where = where


class NoParallelismWarning(UserWarning):
    """Warned by `auto_parallelize` when the plan leaves every mesh axis of more than one device unused (every op
    and parameter Replicate: the N launched ranks do N copies of the same work) or some of them (an idle 'tp'
    of a dp x tp mesh). The message is the plan's note (`Plan.notes`): why (a batch smaller than the axes, ops
    without a sharding rule, axis roles, the cost model) and the remedies. Attribute `axes`: the idle axes."""

    def __init__(self, message: str, axes: tuple[str, ...] = ()):
        super().__init__(message)
        self.axes = tuple(axes)


class PrecisionWarning(UserWarning):
    """Warned by the planner when a DEFAULTED bf16 (a GPU preset, no `precision=`: priced, not run) cannot be priced
    in the dtypes torch.autocast would give the graph (an op that fails under autocast, e.g. an FFT of a bf16 matmul
    output): the plan is priced with every fp32 tensor at bf16 instead, as before round 25 (`planner.costs`)."""


class StaleModelWarning(UserWarning):
    """Warned (once per model) when the model given to `auto_parallelize` is run or its `state_dict()` is read
    after the parallel module it was wrapped into has changed its parameters (an optimizer step, a load): the
    parallel module trains its own tensors (this rank's shards or stage copies), never the model's, so the
    model still computes with, and saves, the weights it had when it was wrapped. Remedy in the message:
    `pm(...)` to run, `pm.full_state_dict()` / `parallelizer.checkpoint` to save, `pm.full_model()` for the
    model's own modules with the trained weights."""



class RankCrashWarning(RuntimeWarning):
    """Warned by `runtime.spawn` when a rank died by a crash signal (SIGABRT, SIGSEGV, SIGBUS) without a report
    while no rank raised an error of its own (the others only lost their connection to it), and the launch was
    therefore re-run once. The message names the function, the rank, the signal, the last lines the rank wrote
    to stderr (faulthandler's Python stack of every thread), and that the launch was re-run. Attributes:
    `ranks` (rank -> signal name), `function` (the qualified name of the launched function)."""

    def __init__(self, message: str, ranks: dict[int, str] | None = None, function: str = "") -> None:
        super().__init__(message)
        self.ranks = dict(ranks or {})
        self.function = function


class CheckpointFilesError(ParallelizerError, FileNotFoundError):
    """A checkpoint directory lacks files it needs: its `.metadata` (DCP writes it last: a save interrupted before
    its end), or a file its metadata lists (another rank's file on storage this rank does not share, or a save
    interrupted on one rank). Attributes: path, missing (file names)."""

    def __init__(self, message: str, path: str = "", missing: list[str] | None = None) -> None:
        self.path, self.missing = path, list(missing or ())
        super().__init__(message)

def rank0_failure(kind: str, text: str, rank: int) -> BaseException:
    """The error a rank raises when rank 0's planning raised `kind` ("module:qualname") with message `text`: the
    same class, so that `except InfeasiblePlanError:` (a retry with another budget) catches it on every rank alike,
    and a `ParallelizerError` as before. Built without the class's own `__init__` (its arguments stayed on rank 0):
    structured attributes are absent; the message names rank 0 as where it was raised."""
    import importlib

    module, _, qualname = kind.partition(":")
    cls = None
    try:
        cls = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
    except (ImportError, AttributeError, ValueError):
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls = ParallelizerError
    elif not issubclass(cls, ParallelizerError):  # e.g. a ValueError of the roles: keep both contracts
        cls = type(cls.__name__, (cls, ParallelizerError), {"__module__": cls.__module__})
    exc = cls.__new__(cls)
    Exception.__init__(exc, f"planning failed on rank 0, so rank {rank} has no plan: {text}")
    return exc
