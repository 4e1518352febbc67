"""Round 10a probe: a data loader's batches through auto_parallelize on pp=2 x dp=2 (pm.step) vs one device.
Run: PYTHONPATH=$PWD:$PWD/trial python trial/probe_pipeline.py"""
import copy

import torch

from probe_common import B, T, err, ids, llama


def rank_fn(rank, world):
    import warnings
    warnings.simplefilter("ignore")
    import parallelizer
    bb = 2 * B  # global batch 8: 2 microbatches of 4 -> dp shards of 2
    x = ids(bb)
    y = ids(bb, seed=2); y[0, :5] = -100; y[5] = -100  # uneven ignored labels, one fully ignored row
    mask = torch.ones(bb, T, dtype=torch.long); mask[5] = 0; mask[1, :3] = 0
    model = llama(use_cache=False); ref = copy.deepcopy(model)
    pm = parallelizer.auto_parallelize(model, (), example_kwargs=dict(input_ids=x, attention_mask=mask, labels=y),
                                       mesh={"pp": 2, "dp": 2})
    out = {}
    try:
        loss = pm.step(input_ids=x, attention_mask=mask, labels=y)
        e = ref(input_ids=x, attention_mask=mask, labels=y).loss
        e.backward()
        sd = pm.full_state_dict()  # no optimizer step: compare the loss and one gradient via clip norm
        tot = pm.clip_grad_norm_(1e9)
        etot = torch.nn.utils.get_total_norm([p.grad for p in ref.parameters()])
        out["kw_mask_labels"] = f"loss {loss.item():.6f} vs {e.item():.6f}; grad norm {float(tot):.6f} vs {float(etot):.6f}"
    except Exception as exc:  # noqa: BLE001
        out["kw_mask_labels"] = err(exc)
    for name, kw in {"batch_12": dict(input_ids=ids(12), attention_mask=torch.ones(12, T, dtype=torch.long), labels=ids(12)),
                     "batch_7": dict(input_ids=ids(7), attention_mask=torch.ones(7, T, dtype=torch.long), labels=ids(7)),
                     "num_items_0d": dict(input_ids=x, attention_mask=mask, labels=y, num_items_in_batch=(y != -100).sum()),
                     "num_items_int": dict(input_ids=x, attention_mask=mask, labels=y, num_items_in_batch=40),
                     "seq_12": dict(input_ids=ids(bb, 12), attention_mask=torch.ones(bb, 12, dtype=torch.long), labels=ids(bb, 12)),
                     "int32": dict(input_ids=x.int(), attention_mask=mask, labels=y)}.items():
        try:
            pm.step(**kw)
            out[name] = "ran"
        except Exception as exc:  # noqa: BLE001
            out[name] = err(exc)
    return out


if __name__ == "__main__":
    from parallelizer.runtime.launch import spawn
    res = spawn(rank_fn, 4, timeout_s=900)
    for k in res[0]:
        print(k, "|", " ## ".join(sorted({r[k] for r in res})))
