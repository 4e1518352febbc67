"""PuLP's HiGHS interface with the model handed to highspy in bulk: the same model, built without a Python call per
column and per row (`ilp._solver`).

`pulp.HiGHS.buildSolverModel` (PuLP 3.3; pyproject.toml pins pulp to 3.3.x because this subclass reads its
internals) adds each column with `Highs.addCol` and each row with `Highs.addRow`, and
its `actualSolve` walks every constraint of the problem three times (`LpProblem.variables()` registers the variables
of each constraint on each call). On the dp x tp plan of a 2-layer Llama (44k columns, 14k rows) that was ~10% of the
plan's CPU (round 26, r26a). `BulkHiGHS` builds exactly PuLP's model, in PuLP's order: columns are
`LpProblem.variables()` (sorted by name) with cost `objective.get(var, 0)`, PuLP's bounds (None = infinite) and
integrality (LpInteger when `mip`); rows are the constraints in insertion order, each with its non-zero
coefficients in the expression's order and PuLP's `getLb()` / `getUb()`; they go in with one `addCols`, one
`changeColsIntegrality` and one `addRows` (HiGHS appends rows to its column-wise matrix in row order either way:
`tests/unit/test_planner_speed.py` compares the two models written out by HiGHS). Solution values and statuses are read
back by PuLP's own `findSolutionValues`.
"""
from __future__ import annotations

import contextlib
import os
import sys

import highspy
import numpy as np
import pulp
from pulp import constants


class BulkHiGHS(pulp.HiGHS):
    """`pulp.HiGHS` (same options, statuses and solution values) whose model is built in bulk (module docstring)."""

    def buildSolverModel(self, lp: pulp.LpProblem) -> None:
        """PuLP's model of `lp` into `lp.solverModel` (module docstring); sets `var.index` / `constraint.index` as
        PuLP does. Keeps the column list for `actualSolve` (`self._columns`)."""
        inf = highspy.kHighsInf
        columns = self._columns = lp.variables()
        sign = -1 if lp.sense == constants.LpMaximize else 1
        objective = lp.objective
        for i, var in enumerate(columns):
            var.index = i
        cost = np.array([sign * objective.get(v, 0.0) for v in columns], dtype=np.float64)
        lower = np.array([-inf if v.lowBound is None else v.lowBound for v in columns], dtype=np.float64)
        upper = np.array([inf if v.upBound is None else v.upBound for v in columns], dtype=np.float64)
        h = lp.solverModel
        h.addCols(len(columns), cost, lower, upper, 0, np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0))
        if self.mip:
            ints = np.array([v.index for v in columns if v.cat == constants.LpInteger], dtype=np.int32)
            if len(ints):
                h.changeColsIntegrality(len(ints), ints,
                                        np.full(len(ints), highspy.HighsVarType.kInteger.value, dtype=np.uint8))
        starts, index, value, row_lower, row_upper = [], [], [], [], []
        for i, constraint in enumerate(lp._constraints.values()):
            starts.append(len(index))
            for var, coefficient in constraint.items():
                if coefficient != 0:
                    index.append(var.index)
                    value.append(coefficient)
            constraint.index = i
            lb, ub = constraint.getLb(), constraint.getUb()
            row_lower.append(-inf if lb is None else lb)
            row_upper.append(inf if ub is None else ub)
        if starts:
            h.addRows(len(starts), np.array(row_lower, dtype=np.float64), np.array(row_upper, dtype=np.float64),
                      len(index), np.array(starts, dtype=np.int32), np.array(index, dtype=np.int32),
                      np.array(value, dtype=np.float64))

    def actualSolve(self, lp: pulp.LpProblem, **kwargs):  # type: ignore[override]
        """`pulp.HiGHS.actualSolve` with the column list of `buildSolverModel` read back instead of walking the
        constraints again (`LpProblem.variables()` returns that same list while no constraint is added)."""
        self.createAndConfigureSolver(lp)
        self.buildSolverModel(lp)
        self.callSolver(lp)
        columns = self._columns
        lp.variables = lambda: columns  # for `findSolutionValues` only (an instance attribute, removed below)
        try:
            status, sol_status = self.findSolutionValues(lp)
        finally:
            del lp.variables
        for var in columns:
            var.modified = False
        for constraint in lp._constraints.values():
            constraint.modifier = False
        lp.assignStatus(status, sol_status)
        return status


@contextlib.contextmanager
def quiet_stdout():
    """Silence file descriptor 1 while solving: HiGHS (checked on highspy 1.16) prints its banner to the
    C-level stdout on every solve even with msg=False, which clutters the CLI and notebooks."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
