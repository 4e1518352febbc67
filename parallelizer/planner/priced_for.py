"""What a plan was priced for, recorded in its JSON so that a hand edit of it is refused on load.

A plan's cost, memory and layouts hold for the settings it was solved under: its mesh (shape and axis names; a
pipeline's pp degree and full mesh), the cluster or calibration profile it was priced on (`Plan.cluster`), its
planning config (precision, memory budget and reserve, optimizer, axis roles, ...: `Plan.config`) and the model
it was made for (`model.batch`: global batch, grad accumulation, sequence length, traced batch; `model.recipe`:
how `rehearse` rebuilds it). Editing one of them in the JSON does not re-solve anything: before round 26 a mesh
edited from (dp=2, tp=2) to (dp=4, tp=1) loaded as a plan on (dp=4, tp=1) carrying the 2x2 plan's step time and
memory, and a `model.batch` edited 8 -> 7 was what `show` printed (trial r25h).

`priced_for(doc)` maps each of these fields (JSON paths "mesh", "cluster", "config/<key>", "model/batch",
"model/recipe", "pipeline/pp", "pipeline/mesh") to the first 16 hex digits of the sha256 of its canonical JSON
(sorted keys); `Plan.to_dict` writes it as the document's "priced_for", and `check_priced_for(doc)` (called by
`Plan.from_json`, so by `Plan.load`, `parallelizer show`, `rehearse` and `auto_parallelize(plan=)`) recomputes
it and raises `PlanValidationError` naming every field whose value is not the one the plan was priced for. The
digests detect edits, they do not authenticate: a file rewritten with matching digests is the writer's claim.

The edits README section 3 allows stay allowed: layouts (graph rows, block positions, stored layouts: checked
against the model's rules by `fingerprint.check_plan`), a pipeline's schedule, microbatches and stage cut; those
keep the cost as priced for the unedited plan (price them with `planner.steptime.estimate_step_time`). A
document written before round 26 has no "priced_for" and loads as before.
"""
from __future__ import annotations

import hashlib
import json

from ..errors import PlanValidationError

_DIGITS = 16  # hex digits of sha256 kept per field: 64 bits, to detect edits (not to authenticate)


def priced_for(doc: dict) -> dict[str, str]:
    """{JSON path: digest} of the fields a plan document was priced for (module docstring); deterministic.

    Args:
        doc: a plan document as `Plan.to_dict` returns it (before "priced_for" is added) or as JSON read it.
    """
    fields = {"mesh": doc["mesh"], "cluster": doc.get("cluster")}
    fields.update({f"config/{key}": value for key, value in doc.get("config", {}).items()})
    for key in ("batch", "recipe"):
        if key in doc.get("model", {}):
            fields[f"model/{key}"] = doc["model"][key]
    if doc.get("pipeline") is not None:
        fields["pipeline/pp"], fields["pipeline/mesh"] = doc["pipeline"]["pp"], doc["pipeline"]["mesh"]
    return {path: _digest(value) for path, value in sorted(fields.items())}


def check_priced_for(doc: dict, source: str = "plan JSON") -> None:
    """Raise when a field of `doc` differs from what its "priced_for" records (a hand edit); None when it agrees
    or when `doc` has no record (written before round 26).

    Raises:
        PlanValidationError: naming each edited field (its JSON path, in `.path` the first) and its value now,
            with the remedy: re-plan with the edited setting (`parallelizer plan --mesh ...`, `--global-batch`,
            `--precision`, `--cluster`), or restore the field.
    """
    recorded = doc.get("priced_for")
    if recorded is None:
        return
    now = priced_for(doc)
    edited = sorted(path for path in recorded.keys() | now.keys() if recorded.get(path) != now.get(path))
    if not edited:
        return
    lines = [f"{path}: now {_value(doc, path)}" for path in edited]
    raise PlanValidationError(
        f"{source}: edited after it was priced: " + "; ".join(lines) + ". The plan's cost, memory and layouts were "
        "computed for the value written when it was saved, and a load does not re-solve (a mesh edited to another "
        "factorisation of the same devices would run and report the old mesh's step time). Remedy: re-plan with the "
        "setting you want (`parallelizer plan --mesh ... --global-batch ... --precision ... --cluster ...`, "
        "or `parallelizer.plan(traced, mesh, ...)` then `plan.save(path)`), or restore the field; layouts and a "
        "pipeline's schedule, microbatches and cut may be edited (README section 3).", edited[0])


def _digest(value) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:_DIGITS]


def _value(doc: dict, path: str):
    """The value at a "priced_for" path of `doc` ("absent" when missing), for the message."""
    node = doc
    for key in path.split("/"):
        if not isinstance(node, dict) or key not in node:
            return "absent"
        node = node[key]
    return json.dumps(node, sort_keys=True)
