"""Layers that differ except for a repeated `attn` part, planned on pp=2 (the search cuts at layers.*.attn):
rehearsed against one device. python -m trial.pp_mixed5b"""
import contextlib
import io

import parallelizer
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.pipeline_rehearsal import rehearse_pipeline
from trial.hf5b import mixed_layers

if __name__ == "__main__":
    model, inputs = mixed_layers(batch=4)
    with contextlib.redirect_stderr(io.StringIO()):
        traced = parallelizer.trace(model, inputs)
        plan = parallelizer.plan(traced, {"pp": 2, "dp": 1}, global_batch=8)
    print(plan.summary()[:600])
    print(plan.pipeline.microbatches, [s for s in plan.pipeline.stages] if hasattr(plan.pipeline, "stages") else "")
    print(rehearse_pipeline(mixed_layers, {"batch": 4 * plan.pipeline.microbatches}, spec_from_plan(plan),
                            plan.pipeline, steps=2))
