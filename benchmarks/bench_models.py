"""Benchmark: bring any model. Every catalog model (`parallelizer.zoo.catalog`: one per transformers family with
its DEFAULT config apart from sizes and dropout, plus hand-written kinds) goes through trace -> plan on three
meshes with forced axis roles -> rehearse on gloo ranks against one device.

A cell is "match (r)" when outputs, loss, every gradient and the parameters after 2 AdamW steps agree with
the single-device model (r = worst |diff| / (atol + rtol |ref|), <= 1), "DIFFER (r)" when they do not, or
the class and first line of the error that stopped it. A typed error (a `ParallelizerError` subclass, or a
ValueError the toolkit raises itself for a request it cannot honour, e.g. an axis role that can shard
nothing) is an answer; anything else is marked RAW: a bug of the toolkit, whatever the model does. Errors
raised inside a rank are reported with the class raised there.

Run: `python -m benchmarks.bench_models [MODEL ...] [--mesh dp=2 ...]` (all models and meshes by default;
`make bench` runs everything). About 20-40 s per cell on a 2-core machine (rank start-up dominates).
"""
from __future__ import annotations

import argparse
import importlib
import re
import time
import traceback
from pathlib import Path

import cost_model
import parallelizer
from parallelizer.errors import ParallelizerError
from parallelizer.runtime import DistributedError
from parallelizer.runtime.rehearsal import rehearse
from parallelizer.zoo import catalog

# mesh label -> (mesh, forced axis roles)
MESHES = {
    "dp=2 (ddp)": ({"dp": 2}, {"dp": "ddp"}),
    "tp=2 (tp)": ({"tp": 2}, {"tp": "tp"}),
    "dp=2,tp=2 (fsdp,tp)": ({"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"}),
}
STEPS = 2           # AdamW steps compared by the rehearsal
TIME_LIMIT_S = 60   # solver seconds per plan
RANK_TIMEOUT_S = 300
_FIRST_LINE = 160   # characters of an error's first line kept in a cell
_RANK_ERROR = re.compile(r"^([\w.]+(?:Error|Exception|Exit|Interrupt)): ?(.*)$")


def cell(name: str, mesh: dict, roles: dict) -> tuple[str, float]:
    """(text of the cell, seconds) for catalog model `name` on `mesh` with `roles` (module docstring)."""
    start = time.perf_counter()
    try:
        model, args, kwargs = catalog.build(name)
        traced = parallelizer.trace(model, args, kwargs)
        plan = parallelizer.plan(traced, mesh, axis_roles=roles, time_limit_s=TIME_LIMIT_S)
        report = rehearse(catalog.build, {"name": name}, plan, steps=STEPS, timeout_s=RANK_TIMEOUT_S)
        verdict = "match" if report.matches() else "DIFFER"
        text = f"{verdict} ({report.tolerance_ratio:.2g})"
    except DistributedError as exc:
        text = _rank_error(exc)
    except Exception as exc:  # noqa: BLE001 - the point of the table is to show every error
        typed = isinstance(exc, ParallelizerError) or (isinstance(exc, ValueError) and _raised_by_toolkit(exc))
        text = f"{'' if typed else 'RAW '}`{type(exc).__name__}`: {_first_line(str(exc))}"
    return text, time.perf_counter() - start


def _rank_error(exc: DistributedError) -> str:
    """The error raised inside the first failing rank: its class (RAW unless typed) and first line."""
    for detail in exc.failures.values():
        lines = [ln for ln in detail.strip().splitlines() if ln and not ln.startswith(" ")]
        for line in reversed(lines):
            match = _RANK_ERROR.match(line)
            if match:
                qualified, message = match.groups()
                short = qualified.rpartition(".")[2]
                typed = _is_typed(qualified)
                return f"{'' if typed else 'RAW '}`{short}` (in a rank): {_first_line(message)}"
    return f"`DistributedError`: {_first_line(str(exc))}"


def _raised_by_toolkit(exc: BaseException) -> bool:
    """Whether the innermost frame of the traceback is in the parallelizer or cost_model packages."""
    frames = traceback.extract_tb(exc.__traceback__)
    roots = (str(Path(parallelizer.__file__).parent), str(Path(cost_model.__file__).parent))
    return bool(frames) and frames[-1].filename.startswith(roots)


def _is_typed(qualified: str) -> bool:
    """Whether "package.module.Class" names a `ParallelizerError` subclass."""
    module, _, name = qualified.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return False
    return isinstance(cls, type) and issubclass(cls, ParallelizerError)


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    line = line.replace("|", "\\|")
    return line if len(line) <= _FIRST_LINE else line[:_FIRST_LINE] + "..."


def table(models: list[str], meshes: list[str], progress: bool = True) -> tuple[str, dict]:
    """Markdown table (model x mesh) and the cells {(model, mesh): (text, seconds)}."""
    cells = {}
    for name in models:
        for label in meshes:
            cells[name, label] = cell(name, *MESHES[label])
            if progress:
                print(f"  {name:16s} {label:20s} {cells[name, label][1]:6.1f} s  {cells[name, label][0]}", flush=True)
    lines = ["| model | " + " | ".join(meshes) + " |", "|---|" + "---|" * len(meshes)]
    lines += [f"| {name} | " + " | ".join(cells[name, label][0] for label in meshes) + " |" for name in models]
    return "\n".join(lines), cells


def run(models: list[str] | None = None, meshes: list[str] | None = None) -> str:
    """Markdown section for benchmarks/RESULTS.md (`make bench`)."""
    models = models or list(catalog.CATALOG)
    meshes = meshes or list(MESHES)
    start = time.perf_counter()
    text, cells = table(models, meshes)
    counts = {k: sum(v[0].startswith(k) for v in cells.values()) for k in ("match", "DIFFER", "RAW", "`")}
    return "\n".join([
        "## Bring any model: trace -> plan -> rehearse on gloo ranks",
        "",
        f"{len(models)} models (`parallelizer.zoo.catalog`: transformers families built from their config classes "
        "with DEFAULT options apart from sizes and dropout 0, plus hand-written kinds) x "
        f"{len(meshes)} meshes with forced axis roles; rehearsal: {STEPS} AdamW steps, outputs, loss, every gradient "
        "and the parameters compared with one device; a cell shows `match (worst |diff| / (atol + rtol |ref|))` "
        "(torch.testing's tolerances for the dtype), "
        "`DIFFER (...)`, or the error class and its first line (RAW = not a typed error of the toolkit).",
        "",
        text,
        "",
        f"Cells: {counts['match']} match, {counts['DIFFER']} differ, {counts['`']} typed errors, {counts['RAW']} raw "
        f"errors; {time.perf_counter() - start:.0f} s.",
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", help=f"catalog models (default all: {', '.join(catalog.CATALOG)})")
    ap.add_argument("--mesh", action="append", choices=list(MESHES), help="mesh labels (default all)")
    args = ap.parse_args()
    print(run(args.models or None, args.mesh))


if __name__ == "__main__":
    main()
