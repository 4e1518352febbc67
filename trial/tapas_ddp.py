"""TAPAS (TapasForMaskedLM, tiny) given token_type_ids with value 2 in its 4th type (an embedding of 2 rows):
eager raises IndexError, torch.export (fake tensors, no value checks) traces it, and before 7b17184 the tracer
only noted "a call raised IndexError"; planned on ddp dp=2 every rank then raised IndexError inside the sharded
program (`rehearse`: DistributedError). Now `trace` warns "the model's eager forward raises IndexError ..."."""
import sys
import warnings
sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch
import parallelizer
import hf_models as H


def bad_tapas(seed=0, device="cpu"):
    m, a, k = H.tapas(seed, device)
    k["token_type_ids"] = torch.randint(0, 3, (H.B, H.S, 7), generator=torch.Generator().manual_seed(2))
    return m, a, k


if __name__ == "__main__":
    m, a, k = bad_tapas()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        parallelizer.trace(m, a, k)
    print([str(x.message)[:200] for x in w if "eager forward raises" in str(x.message)] or "no warning (before 7b17184)")
