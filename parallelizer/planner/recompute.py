"""Activation recomputation: what the planner decides and the runtime emits (one vocabulary for both).

A decision maps a region to a mode. Regions are repeated-block members, named by their module FQN as the
tracer reports them (`NodeInfo.block`, e.g. "transformer.h.3"). Modes (Korthikanti et al., "Reducing
Activation Recomputation in Large Transformer Models", MLSys 2023, Sec. 4-5):
  * "none": every tensor the block's backward needs is saved in forward;
  * "selective": the attention core (QK^T, softmax, dropout, attention x V; one fused SDPA op where the
    graph has it) is recomputed in backward, everything else is saved;
  * "full": only the block's inputs are saved; the block's whole forward runs again in backward.
`Plan.recompute` holds the regions whose mode is not "none" (the JSON key "recompute", present only when
non-empty, so plans without recomputation are byte-identical to before).
"""
from __future__ import annotations

RECOMPUTE_MODES = ("none", "selective", "full")
"""The per-region modes, cheapest in compute first."""

RECOMPUTE_OPTIONS = ("auto",) + RECOMPUTE_MODES
"""What a user may ask for (`PlanConfig.recompute`, `--recompute`): "auto" lets the planner choose per
region; a mode forces it on every repeated-block member."""
