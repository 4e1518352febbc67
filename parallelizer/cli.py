"""`parallelizer` command line: plan, show, rehearse, calibrate (also `python -m parallelizer`).

    parallelizer plan --model gpt2 --config n_layer=24,n_embd=2048 --cluster h100:2x8 --mesh dp=4,tp=4 \\
        --global-batch 512 --grad-accum 8 --seq-len 2048 -o plan.json
    parallelizer show plan.json [--all]
    parallelizer rehearse plan.json --nproc 4 [--width auto|real|reduced]
    parallelizer calibrate -o profile.json [--nprocs 2 4] [--quick] [--compare OLD.json]

Batch: `plan` traces ONE forward/backward of `--global-batch / --grad-accum` samples (default grad-accum 1:
the whole global batch in one step) on the meta device; the planner shards that batch over the data axes.
The estimated step time in the plan is for that traced batch; the summary also gives the time per optimizer
step (x grad-accum; gradient syncs are counted once per traced step, an upper bound).

Search (one planner, `parallelizer.plan`): without `--mesh`, every factorisation (pp, dp, tp) of the cluster's
devices (tp inside a node), microbatch count and schedule is priced by the pipeline search
(`parallelizer/planner/search.py`); the winner's Plan is then built: pp=1 -> the ILP on its (dp, tp) mesh,
pp>1 -> a pipeline Plan with the search's (possibly uneven) stage cuts, schedule, microbatches and estimate.
The model is traced again at the winner's microbatch (global batch / microbatches) when that differs.
`--mesh pp=2,dp=2,tp=2` fixes the factorisation, `--schedule` restricts the schedule, `--microbatches` fixes
the microbatches. A `--mesh` without pp is planned by the ILP alone (no search).

Cluster: `--cluster` names what the plan is priced on; without it the CLI applies the Python API's rule
(`parallelizer.planner.api.resolve_cluster`): DGX H100 nodes holding exactly the mesh's devices, or one node
of 8 when there is no `--mesh` either (`parallelizer.api.search_cluster`).

Models: a preset or `package.module:factory`; a factory returns `(model, args)`, `(model, args, kwargs)`
(keyword inputs such as labels=) or a transformers model (token ids are made for it).

Architecture, vocabulary and the placement notation (S(0), R, P per mesh axis): docs/architecture.md.

Exit codes: 0 success; 1 rehearsal numerics differ; 2 bad input or an error of the toolkit (message on stderr);
141 (128 + SIGPIPE, as Unix tools) when stdout is closed early, e.g. `parallelizer show plan.json | head`; 130 (128 +
SIGINT) when interrupted with Ctrl-C (one line on stderr; a terminal's Ctrl-C reaches `rehearse`'s ranks too).
"""
from __future__ import annotations

import argparse
import ast
import functools
import json
import os
import sys
import time
from collections.abc import Sequence

from cost_model.compression import POWERSGD_DEFAULT_WARMUP

from .core.mesh import MeshSpec
from .errors import ParallelizerError
from .planner.stages import SCHEDULE_NAMES

# Rehearse at the model's real width only when it is this small (parameters) and fits in half the free memory
# (per rank: ~48 B/param for the sharded copy, the reference copy, their grads and AdamW states, plus twice the
# plan's activations). Larger models are rehearsed at reduced width (`presets.reduced`).
_REAL_WIDTH_MAX_PARAMS = 20_000_000
_BYTES_PER_PARAM_REHEARSAL = 48


def parse_kv(text: str | None, what: str) -> dict:
    """"a=1,b=x,c=False,l=[1,2]" -> {"a": 1, "b": "x", "c": False, "l": [1, 2]} (items split at commas outside
    brackets and quotes; values parsed as JSON or else as Python literals when
    they are, so `true` and `True`, `null` and `None` are the bool / None a config expects, not the truthy
    string "False"; anything else stays a string).

    Raises ValueError naming `what` and the malformed item."""
    out: dict = {}
    for item in filter(None, _items(text or "")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            example = {"--mesh": "dp=4,tp=2", "--roles": "dp=fsdp,tp=tp"}.get(what, "n_layer=24")
            raise ValueError(f"{what}: {item!r} is not KEY=VALUE (e.g. {example})")
        if key.strip() in out:
            raise ValueError(f"{what}: {key.strip()!r} is given twice in {text!r}")
        out[key.strip()] = _value(value.strip())
    return out


def _items(text: str) -> list[str]:
    """`text` split at the commas outside brackets and quotes: "l=[1,2],n=3" -> ["l=[1,2]", "n=3"]."""
    items, depth, quote, start = [], 0, None, 0
    for i, char in enumerate(text):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    return [*items, text[start:]]


def _value(text: str):
    """`text` as JSON, else as a Python literal (`False`, `None`, `1e-5`, `'gelu'`), else the string itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def parse_mesh(text: str) -> MeshSpec:
    """"dp=4,tp=2" -> MeshSpec(("dp", "tp"), (4, 2)) (last axis innermost). Raises ValueError."""
    try:
        return MeshSpec.of(text)
    except ValueError as exc:  # "mesh 'dp2': ..." from the parser; the MeshSpec's own checks name no string
        raise ValueError(f"--{exc}" if str(exc).startswith("mesh ") else f"--mesh {text!r}: {exc}") from None


def _number(kind: type, least: float, what: str, strict: bool = False):
    """An argparse type: `kind` (int or float) of at least `least`, or above it when `strict` (argparse then exits 2
    naming the option, before any work: a 0 there ran a rehearsal that compared nothing, or failed in the planner)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not (value > least if strict else value >= least):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value
    return parse


_COUNT = _number(int, 1, "an integer >= 1")
_COUNT0 = _number(int, 0, "an integer >= 0")
_AMOUNT = _number(float, 0.0, "> 0", strict=True)
_AMOUNT0 = _number(float, 0.0, ">= 0")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="parallelizer", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="trace a model on the meta device and plan its sharding")
    p.add_argument("--model", required=True, help="preset (gpt2, gpt2-medium, llama2-7b, bert, vit, mlp, gpt, ...) "
                   "or package.module:factory")
    p.add_argument("--config", default="", help="config overrides, e.g. n_layer=24,n_embd=2048,use_cache=False "
                   "(values are JSON or Python literals, else strings)")
    p.add_argument("--cluster", help="PRESET:NODESxDEVICES (e.g. h100:2x8; presets a100, h100, h200, ethernet "
                   "(25 GbE), internet (100 Mb/s, 30 ms): cost_model/topology.py) or a calibration profile JSON "
                   "(default: DGX H100 nodes holding the --mesh, as the Python API; h100:1x8 without --mesh)")
    p.add_argument("--mesh", help="dp=4,tp=4: the ILP on that mesh; pp=2,dp=4,tp=2: the search with that "
                   "factorisation fixed (default: search every (pp, dp, tp) of the cluster's devices)")
    p.add_argument("--roles", help="force the parallelism of mesh axes (needs --mesh), e.g. dp=ddp,tp=tp; "
                                   "roles: ddp, fsdp, tp, auto (default: the planner decides)")
    p.add_argument("--global-batch", type=int, help="samples per optimizer step (default: the model's example)")
    p.add_argument("--grad-accum", type=_COUNT, default=1, help="micro-steps per optimizer step with a --mesh without pp "
                   "(default 1; the search chooses them itself: --microbatches fixes them)")
    p.add_argument("--seq-len", type=_COUNT, help="sequence length (token models)")
    p.add_argument("--memory-budget-gb", type=_AMOUNT, help="per-device memory budget in GB, reserve included "
                   "(default: device memory)")
    p.add_argument("--memory-reserve-gb", type=_AMOUNT0,
                   help="GB of the budget kept out of the plan for allocator fragmentation, cuBLAS/NCCL workspaces and "
                        "communication buffers (default: 10%% of a GPU's memory + 1 GB with the device's memory as "
                        "budget, 0 with --memory-budget-gb or on a calibrated CPU; cost_model/reserve.py)")
    p.add_argument("--precision", choices=("bf16", "fp32"),
                   help="bf16: priced as torch.autocast(bfloat16) runs an fp32 model (each op in autocast's dtypes), fp32 main "
                        "weights and gradients (18 B/param with AdamW); "
                        "fp32: 16 B/param (default: bf16 on GPU cluster presets, fp32 on a calibration profile)")
    p.add_argument("--recompute", default="auto", choices=("auto", "none", "selective", "full"),
                   help="activation recomputation per repeated block: auto (default) lets the planner choose where "
                        "memory needs it or it lets a faster layout fit; none, selective (the attention core) or full force it on every block")
    p.add_argument("--compression", default="none", choices=("none", "auto", "powersgd", "bf16"),
                   help="data-parallel gradient compression: none (default, exact), auto (the planner picks it when "
                        "it speeds the estimated step up >= 1.25x, e.g. over slow links: --cluster internet:8x1), "
                        "powersgd or bf16 (forced); planner/compression.py")
    p.add_argument("--powersgd-rank", type=_COUNT, default=4, help="PowerSGD approximation rank (default 4)")
    p.add_argument("--powersgd-warmup", type=_COUNT0, default=POWERSGD_DEFAULT_WARMUP,
                   help="optimizer steps all-reduced exactly before PowerSGD starts (default 1000, torch's "
                        "start_powerSGD_iter; torch's docs advise ~10%% of the run's steps)")
    p.add_argument("--boundary-compression", default="none", choices=("none", "auto", "int8", "lowrank"),
                   help="compress activations and their gradients sent between pipeline stages: none (default), auto "
                        "(the search picks int8 per boundary where it pays), int8 or lowrank on every boundary "
                        "(parallelizer/planner/boundary.py)")
    p.add_argument("--boundary-rank", type=_COUNT, default=8, help="subspace rank of --boundary-compression lowrank")
    p.add_argument("--zero1", metavar="AXIS",
                   help="partition the optimizer state over this data-parallel mesh axis (ZeRO-1, e.g. dp; the axis "
                        "runs data parallel): priced as 1/N of it per rank plus a parameter all-gather per step; run "
                        "it with ZeroRedundancyOptimizer(pm.parameters(), optimizer_class=..., "
                        "process_group=pm.process_group(AXIS)) (parallelizer/runtime/zero1.py)")
    p.add_argument("--optimizer", default="adamw", choices=("adamw", "adam", "sgd"),
                   help="optimizer whose state is counted in the memory per device (default adamw)")
    p.add_argument("--schedule", choices=SCHEDULE_NAMES,
                   help="restrict the search to this pipeline schedule (default: all of them, "
                        "parallelizer/planner/stages.py)")
    p.add_argument("--microbatches", type=_COUNT, help="fix the microbatches per optimizer step (pipeline microbatches, "
                   "or gradient-accumulation steps when pp=1; default: searched, pp with a fixed pp mesh and no "
                   "--global-batch); the plan's graph is ONE microbatch: global batch / microbatches")
    p.add_argument("--virtual-stages", type=_COUNT, help="stages per pp rank (1 for gpipe/1f1b, 2 for interleaved_1f1b)")
    p.add_argument("--time-limit", type=_AMOUNT, default=60.0, help="solver seconds per mesh (default 60)")
    p.add_argument("-o", "--out", default="plan.json", help="plan JSON to write (default plan.json)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--allow-frozen-host-random", action="store_true",
                   help="plan a model whose training forward draws from numpy / Python random (e.g. SpecAugment, "
                        "mask_time_prob > 0) with its one traced draw repeated every step (default: refused, naming "
                        "the draw and the config switch)")
    s = sub.add_parser("show", help="print a plan as tables")
    s.add_argument("plan", help="plan JSON written by `parallelizer plan` or Plan.save")
    s.add_argument("--all", action="store_true", help="every node position of each block, not only the main ops")
    r = sub.add_parser("rehearse", help="run a plan on local gloo ranks and compare with one device")
    r.add_argument("plan", help="plan JSON written by `parallelizer plan` (it records how to rebuild the model)")
    r.add_argument("--nproc", type=_COUNT, required=True, help="local ranks; must equal the plan's mesh size")
    r.add_argument("--width", choices=("auto", "real", "reduced"), default="auto",
                   help="model width: real, reduced (same structure, small dims) or auto (real when small)")
    r.add_argument("--steps", type=_COUNT, default=3, help="optimizer steps compared (default 3)")
    r.add_argument("--timeout", type=_AMOUNT, default=900.0,
                   help="seconds before the ranks are killed (default 900)")
    c = sub.add_parser("calibrate", help="measure this machine into a cost-model profile")
    c.add_argument("-o", "--out", required=True, help="profile JSON to write; plan with --cluster PROFILE.json")
    c.add_argument("--nprocs", type=_COUNT, nargs="+", default=[2, 4],
                   help="process counts whose gloo collectives are measured (default: 2 4)")
    c.add_argument("--quick", action="store_true", help="messages up to 64 MiB (default: up to 256 MiB)")
    c.add_argument("--compare", metavar="OLD.json", help="an earlier profile: print how far the new one differs")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (module docstring)."""
    args = _parser().parse_args(argv)
    try:
        return {"plan": cmd_plan, "show": cmd_show, "rehearse": cmd_rehearse, "calibrate": cmd_calibrate}[
            args.command](args)
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as Unix tools do
        try:  # point stdout at /dev/null so that the interpreter's final flush does not raise again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return 141
    except (ParallelizerError, ValueError, OSError) as exc:  # OSError: e.g. a directory given as a file
        from tqdm import tqdm
        tqdm.write(f"error: {exc}", file=sys.stderr)  # on its own line, not after an open progress bar
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, not the interpreter's traceback of wherever it waited (r25h)
        print(f"\ninterrupted: parallelizer {args.command} stopped (Ctrl-C)", file=sys.stderr)
        return 130


def cmd_plan(args) -> int:
    """`parallelizer plan`: build on meta, trace, plan (`parallelizer.plan`: a search without --mesh or with a
    'pp' axis, the ILP on a --mesh without pp), print the summary, write JSON."""
    from tqdm import tqdm

    from . import api, presets
    from .tracer import trace

    _check_writable(args.out)
    if args.global_batch is not None and args.global_batch < 1:
        raise ValueError(f"--global-batch {args.global_batch}: give the number of samples per optimizer step (>= 1)")
    if args.memory_reserve_gb is not None and args.memory_reserve_gb < 0:
        raise ValueError(f"--memory-reserve-gb {args.memory_reserve_gb}: give GB >= 0")
    if args.global_batch is not None and (args.grad_accum < 1 or args.global_batch % args.grad_accum):
        raise ValueError(f"--global-batch {args.global_batch} must be a multiple of --grad-accum {args.grad_accum}")
    mesh = parse_mesh(args.mesh) if args.mesh else None
    if mesh is not None:
        api.cluster_of_mesh(mesh, args.cluster)  # a mesh must use all of --cluster's devices: said before tracing
    searched = mesh is None or "pp" in mesh.axis_names
    pipe = {k: v for k, v in (("schedule", args.schedule), ("microbatches", args.microbatches),
                              ("virtual_stages", args.virtual_stages)) if v is not None}
    if pipe and not searched:
        raise ValueError(f"--{next(iter(pipe)).replace('_', '-')} is for searched or pipeline plans: drop --mesh to "
                         "search, or give a mesh with a 'pp' axis first, e.g. --mesh pp=2,dp=2")
    if searched and args.grad_accum != 1:
        raise ValueError("--grad-accum is for a --mesh without pp; the search chooses the microbatches (gradient "
                         "accumulation steps when pp=1): fix them with --microbatches")
    roles = parse_kv(args.roles, "--roles")
    if roles and mesh is None:
        raise ValueError(f"--roles {args.roles}: give the mesh they refer to with --mesh (e.g. --mesh dp=2,tp=4)")
    micro = args.microbatches or 1  # without --microbatches a search chooses them (a divisor of the batch)
    if args.global_batch is not None and args.global_batch % (args.grad_accum * micro):
        given = f"--microbatches {micro}" if args.microbatches else f"--grad-accum {args.grad_accum}"
        raise ValueError(f"--global-batch {args.global_batch} must be a multiple of {given} (the model is traced "
                         f"with one microbatch). Remedy: a global batch that {given} divides, or drop "
                         f"{given.split()[0]}" + (" and let the search choose the microbatches" if searched else ""))
    config = parse_kv(args.config, "--config")
    bar = tqdm(total=3, desc="build", disable=args.no_progress, file=sys.stderr)
    traced_batch = None if args.global_batch is None else args.global_batch // (args.grad_accum * micro)
    if searched and args.microbatches is None and traced_batch is not None:
        # the search prices a tp group running ONE sample and scales by the microbatch (`planner.segments`):
        # traced at the global batch, its per-tp ILP would shard the batch over "tp" (data parallelism on the
        # tp axis, weights replicated), which no microbatch of 1-4 samples can do. The winner is traced again
        # at its step batch (`retrace` below).
        traced_batch = 1
    start = time.perf_counter()
    bar.set_description("trace")
    trace = functools.partial(trace, allow_frozen_host_random=args.allow_frozen_host_random)
    recipe, traced = _first_traceable(args.model, config, traced_batch, args.seq_len, args.global_batch, trace)
    bar.update(2)
    if traced_batch == 1 and searched and args.microbatches is None and recipe["kwargs"]["batch"] > 1:
        # the model does not run on one sample (BatchNorm over (batch, features)): the search may only choose
        # microbatches of at least the batch it traced (the winner is traced again at its step batch)
        least = recipe["kwargs"]["batch"]
        print(f"note: the model does not trace on fewer than {least} samples; microbatches of >= {least} samples")
        pipe["microbatches"] = tuple(m for m in range(1, args.global_batch + 1)
                                     if args.global_batch % m == 0 and args.global_batch // m >= least)
    used = [recipe]

    def retrace(batch: int):  # the search's winner needs the graph at its step batch (`parallelizer.plan`)
        bar.set_description(f"trace batch {batch}")
        used.append(presets.recipe(args.model, config, batch, args.seq_len))
        return trace(*presets.build(used[-1], "meta"))

    options = dict(cluster=args.cluster, recipe=recipe, optimizer=args.optimizer, time_limit_s=args.time_limit,
                   axis_roles={k: str(v) for k, v in roles.items()},
                   memory_budget_bytes=None if args.memory_budget_gb is None else int(args.memory_budget_gb * 1e9),
                   memory_reserve_bytes=None if args.memory_reserve_gb is None else int(args.memory_reserve_gb * 1e9),
                   precision=args.precision, recompute=args.recompute, compression=args.compression,
                   powersgd_rank=args.powersgd_rank, powersgd_warmup=args.powersgd_warmup,
                   boundary_compression=args.boundary_compression,
                   boundary_rank=args.boundary_rank, zero1=args.zero1)
    bar.set_description("search" if searched else f"solve {mesh}")
    if searched:
        best = api.plan(traced, mesh, global_batch=args.global_batch, retrace=None if args.microbatches else retrace,
                        progress=False if args.no_progress else None, **pipe, **options)
    else:
        best = api.plan(traced, mesh, **options)
    bar.update(bar.total - bar.n)
    bar.close()
    best = _with_batch(best, args, used[-1])
    best.save(args.out)
    print(best.summary(max_nodes=12))
    print("traced inputs: " + ", ".join(f"{n} {tuple(s)}" for n, s in best.model.get("inputs", {}).items()))
    accum = best.model["batch"]["grad_accum"]
    if accum > 1:
        print(f"per optimizer step ({accum} micro-steps): {best.cost.total_s * accum * 1e3:.3f} ms")
    print(f"traced batch: {best.model['batch']['traced_batch'] or 'model default'}; wrote {args.out} "
          f"({time.perf_counter() - start:.1f} s)")
    reason = _unweighted_own_loss(traced) if best.pipeline is not None else None
    if reason:
        print(f"note: pm.step(loss_fn=None) and `parallelizer rehearse` cannot weigh this model's own loss over "
              f"the pipeline's microbatches: {reason}")
    return 0


def _unweighted_own_loss(traced) -> str | None:
    """Why the model's own loss of `traced` cannot be weighted over microbatches (`runtime.loss_weight`: the
    StepError's text, with its remedy), or None when it can (or the model returns no loss to weigh)."""
    from .runtime.loss_weight import own_loss_weighting, returns_scalar_loss
    from .runtime.step import StepError

    if not returns_scalar_loss(traced):
        return None
    try:
        own_loss_weighting(traced)
    except StepError as exc:
        return str(exc)
    return None


def _first_traceable(model: str, config: dict, batch: int | None, seq_len: int | None, global_batch: int | None,
                     trace) -> tuple[dict, object]:
    """(recipe, traced graph) of the model on meta at `batch`; when that is the search's one-sample trace
    (`batch` 1 for a `global_batch`) and the model refuses one sample (BatchNorm over (batch, features) in
    training: "Expected more than 1 value per channel"), at the next divisor of `global_batch` that traces.

    Raises:
        TraceError: the model traces at no batch tried (the error at `batch`).
    """
    from . import presets
    from .errors import TraceError

    first = None
    tried = [batch] if batch != 1 or global_batch is None else [b for b in range(1, global_batch + 1)
                                                                if global_batch % b == 0]
    for b in tried:
        recipe = presets.recipe(model, config, b, seq_len)
        try:
            return recipe, trace(*presets.build(recipe, "meta"))
        except TraceError as exc:
            first = first or exc
            if "batch" not in recipe["kwargs"]:
                raise
    raise first


def _with_batch(plan, args, recipe: dict):
    """The plan with the recipe it was finally traced from and its batch facts ("grad_accum": micro-steps per
    optimizer step: --grad-accum, or the search's microbatches when it chose pp=1; "microbatches" with pp)."""
    import dataclasses

    search = plan.model.get("search")
    micro = search["microbatches"] if search else 1
    batch = {"global_batch": args.global_batch, "grad_accum": micro if search and plan.pipeline is None
             else args.grad_accum, "traced_batch": recipe["kwargs"].get("batch"), "seq_len": args.seq_len,
             **({"microbatches": micro} if plan.pipeline is not None else {})}
    return dataclasses.replace(plan, model={**plan.model, "recipe": recipe, "batch": batch})


def cmd_show(args) -> int:
    """`parallelizer show`: the plan's tables (`plan_io.plan_text`)."""
    from .plan_io import plan_text
    from .planner import Plan

    print(plan_text(Plan.load(args.plan), all_positions=args.all))
    return 0


def cmd_rehearse(args) -> int:
    """`parallelizer rehearse`: `rehearse_plan` on a saved plan; exit 0 when the numerics match (or, with gradient
    compression, deviate by design: reported, not judged), 1 otherwise."""
    from .planner import Plan

    report = rehearse_plan(Plan.load(args.plan), args.nproc, args.width, args.steps, args.timeout)
    return 0 if report.acceptable() else 1


def rehearse_plan(plan, nproc: int, width: str = "auto", steps: int = 3, timeout_s: float = 900.0):
    """Rebuild the plan's model from its recipe (real or reduced width), run the plan on `nproc` gloo ranks
    and compare with one device; prints what it does and the `RehearsalReport`, and returns the report.

    Raises:
        ValueError: nproc differs from the plan's mesh size, or the plan has no recipe (remedies).
        PlanMismatchError: the rebuilt model's structure differs from the plan's.
        DistributedError: a rank failed or timed out.
    """
    from . import presets
    from .fingerprint import check_plan
    from .rewriter.spec import spec_from_plan
    from .runtime.rehearsal import rehearse
    from .tracer import trace

    full = plan.pipeline.mesh if plan.pipeline is not None else plan.mesh
    if full.world_size != nproc:
        raise ValueError(f"the plan's mesh {full} has {full.world_size} devices but --nproc is "
                         f"{nproc}: pass --nproc {full.world_size} or plan for {nproc} devices")
    recipe = plan.model.get("recipe")
    if recipe is None:
        raise ValueError("the plan has no model recipe (it was planned from Python without recipe=). Remedy: "
                         "plan it with `parallelizer plan`, or call parallelizer.runtime.rehearsal.rehearse")
    real = width == "real" or (width == "auto" and _fits_real_width(plan, nproc))
    used = recipe if real else presets.reduced(recipe, plan.mesh.world_size if plan.pipeline else nproc)
    traced = trace(*presets.build(used, "meta"), allow_frozen_host_random=True)  # named next to a DIFFER
    check_plan(plan, traced, structure_only=not real)  # a hand-edited pipeline cut too, before any rank starts
    if plan.pipeline is not None:
        reason = _unweighted_own_loss(traced)
        if reason:  # before any rank starts: the ranks would raise it at their first step
            from .runtime.step import StepError
            raise StepError(f"rehearse runs a pipeline plan with the model's own loss, and cannot weigh it over "
                            f"microbatches: {reason} `parallelizer rehearse` cannot pass target= / item_count= / "
                            "loss_fn=; run the plan in your own loop with them (pm.step), or rehearse a mesh "
                            "without 'pp'")
    settings = ", ".join(f"{k}={v}" for k, v in used["kwargs"].items())
    print(f"rehearsing the plan on {nproc} gloo ranks at {'real' if real else 'reduced'} width"
          + (f": {settings}" if settings else " (the model factory's defaults)"), flush=True)
    start = time.perf_counter()
    if plan.pipeline is not None:
        from .runtime.pipeline_rehearsal import rehearse_pipeline
        report = rehearse_pipeline(presets.build_cpu, _global_batch(used, plan.pipeline.microbatches),
                                   spec_from_plan(plan), plan.pipeline, steps=steps, timeout_s=timeout_s)
    else:
        report = rehearse(presets.build_cpu, used, spec_from_plan(plan), steps=steps, timeout_s=timeout_s)
    print(report)
    if plan.shards_nothing():  # a match says the program is right, not that it shards anything
        print("note: the plan shards nothing, so this match compares one device's work repeated on each rank: "
              + plan.notes()[0])
    print(f"rehearsal took {time.perf_counter() - start:.1f} s", flush=True)
    return report


def _global_batch(recipe: dict, microbatches: int) -> dict:
    """The recipe at the global batch of a pipeline plan (its traced batch is one microbatch).

    Raises:
        ValueError: the recipe has no batch size to scale (a factory without `batch`): remedy.
    """
    if "batch" not in recipe["kwargs"]:
        from . import presets
        batch = presets.build(recipe, "meta")[1][0].shape[0]
        if "factory" in recipe:
            raise ValueError(f"cannot rehearse pipeline plan of factory {recipe['factory']}: it takes no batch "
                             "argument to build the global batch with. Remedy: give the factory a batch= argument")
        return {**recipe, "kwargs": {**recipe["kwargs"], "batch": batch * microbatches}}
    return {**recipe, "kwargs": {**recipe["kwargs"], "batch": recipe["kwargs"]["batch"] * microbatches}}


def _fits_real_width(plan, nproc: int) -> bool:
    """Whether rehearsing at real width is small enough (see _REAL_WIDTH_MAX_PARAMS)."""
    params = plan.model.get("num_parameters", 0)
    per_rank = _BYTES_PER_PARAM_REHEARSAL * params + 2 * plan.cost.memory_bytes["activations"] * plan.mesh.world_size
    free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    return params <= _REAL_WIDTH_MAX_PARAMS and nproc * per_rank <= free / 2


def _check_writable(path: str | None) -> None:
    """Raise ValueError before any work when -o cannot be written: a directory, or a file in a missing directory
    (before, `plan` solved and `calibrate` measured for minutes, then failed; `-o DIR` was a raw traceback)."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"-o {path}: is a directory; give a file name (e.g. -o {os.path.join(path, 'plan.json')})")
    if not os.path.isdir(folder):
        raise ValueError(f"-o {path}: the directory {folder} does not exist; create it (mkdir -p) or write elsewhere")


def cmd_calibrate(args) -> int:
    """`parallelizer calibrate`: `cost_model.calibrate` over gloo, written to -o, with the package's own BitPipe
    runner's per-action costs (`runtime.bitpipe_cost`)."""
    from cost_model.calibrate import main as calibrate_main

    from .runtime.bitpipe_cost import register
    register()

    _check_writable(args.out)
    calibrate_main(["-o", args.out, "--nprocs", *map(str, args.nprocs)] + (["--quick"] if args.quick else [])
                   + (["--compare", args.compare] if args.compare else []))
    return 0


if __name__ == "__main__":
    sys.exit(main())
