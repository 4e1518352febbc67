"""Packed llama (use_cache=True default, no attention_mask) on a pp=2 pipeline (2 microbatches) against eager."""
import contextlib, io
import torch
import parallelizer
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.pipeline_rehearsal import rehearse_pipeline
from parallelizer.zoo import families


def packed(batch_rows: int = 4):
    model, (ids,), kwargs = families.llama()
    ids = ids.repeat(batch_rows // 4, 1)
    pos = torch.arange(ids.shape[1]).repeat(ids.shape[0], 1)
    pos[0::4, 3:] -= 3
    return model, (), {"input_ids": ids, "position_ids": pos, "labels": ids}


if __name__ == "__main__":
    model, args, kwargs = packed(4)
    traced = parallelizer.trace(model, args, kwargs)
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(traced, {"pp": 2}, schedule="1f1b", microbatches=2)
    print(plan.pipeline.pp, plan.pipeline.schedule if hasattr(plan.pipeline, "schedule") else "")
    report = rehearse_pipeline(packed, {"batch_rows": 8}, spec_from_plan(plan), plan.pipeline, steps=2)
    print("pp=2 1f1b", "matches" if report.matches() else "MISMATCH", report)
