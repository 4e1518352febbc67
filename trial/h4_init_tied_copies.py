"""Finding (trial h4): torch.nn.init's random initialisers on a PipelineModule's parameters are accepted, but a
parameter with copies on several pipeline ranks (GPT-2's tied wte / lm_head on the first and last stage; every
parameter under BitPipe, which keeps two copies of each stage) draws different values on each copy: the copies
stay apart for the rest of training (gradients are summed, values never compared), so the pipeline trains an
untied model and its full_state_dict() (the lowest copy) does not reproduce its own loss. Prints the copies'
difference and |pipeline loss - eager loss of pm.full_state_dict()|. Expected after the fix: UnsupportedOpError.
Before the fix: 1f1b matched only because wte happens to be the first 2-d parameter drawn on both pp ranks; zbv
(wte and its copy both on rank 0, drawn twice) and bitpipe (twins drawn in each rank's order) were 0.02-0.03 off."""
import contextlib, copy, io, sys
import torch
import torch.distributed as dist
import parallelizer
from parallelizer import zoo
from parallelizer.runtime.launch import spawn


def lm_loss(out, y):
    return torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), y.flatten())


def body(rank, world, mesh, opts):
    torch.manual_seed(0)
    model, (ids,) = zoo.gpt2(n_layer=4, n_embd=32, n_head=4, vocab_size=128, batch=8, seq_len=16)
    ref = copy.deepcopy(model)
    lab = torch.roll(ids, -1, 1)
    with contextlib.redirect_stdout(io.StringIO()):
        pm = parallelizer.auto_parallelize(model, (ids,), mesh=mesh, **opts)
    torch.manual_seed(1)  # every rank seeded alike, as the docs ask
    try:
        for p in pm.parameters():
            if p.ndim >= 2:
                torch.nn.init.normal_(p, std=0.02)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {str(e)[:160]}"
    full = pm.full_state_dict()
    ref.load_state_dict(full)
    loss = pm.step(ids, target=lab, loss_fn=lm_loss)
    return f"loss {loss.item():.6f}, eager loss of pm.full_state_dict() {lm_loss(ref(ids), lab).item():.6f}"


if __name__ == "__main__":
    for mesh, opts in [({"pp": 2}, {"schedule": "1f1b"}), ({"pp": 2}, {"schedule": "zbv", "microbatches": 4}), ({"pp": 2}, {"schedule": "bitpipe", "microbatches": 2})]:
        print(mesh, opts, spawn(body, 2, mesh, opts, timeout_s=300))
