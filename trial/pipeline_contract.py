"""PipelineModule (pp=2 x dp=2, auto_parallelize + pm.step) vs eager: frozen position embedding, two param
groups (lr / weight decay), LambdaLR, 2 pm.step calls accumulated before each opt.step, zero_grad(set_to_none=
False). Run: python trial/pipeline_contract.py"""
import contextlib, copy, io, sys, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, "tests/distributed")
import torch
import parallelizer
from parallelizer import zoo
from parallelizer.runtime.launch import spawn
from step_workers import _diff, lm_loss, padded_labels


def groups(m):
    named = [(n, p) for n, p in m.named_parameters() if p.requires_grad]
    dec = lambda n: n.endswith("weight") and "ln" not in n
    return [{"params": [p for n, p in named if dec(n)], "lr": 2e-3, "weight_decay": 0.1},
            {"params": [p for n, p in named if not dec(n)], "lr": 5e-3, "weight_decay": 0.0}]


def body(rank, ws, mesh):
    torch.manual_seed(0)
    model, (ids,) = zoo.gpt2(n_layer=4, n_embd=32, n_head=4, vocab_size=128, batch=8, seq_len=16)
    model.transformer.wpe.weight.requires_grad_(False)
    reference = copy.deepcopy(model)
    with contextlib.redirect_stdout(io.StringIO()):
        pm = parallelizer.auto_parallelize(model, (ids,), mesh=mesh)
    opts = [torch.optim.AdamW(groups(m), eps=1e-3) for m in (pm, reference)]
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: 0.5 ** s) for o in opts]
    g = torch.Generator().manual_seed(9)
    worst = {"loss": 0.0, "grad": 0.0}
    for step in range(3):
        for k in range(2):
            b = torch.randint(0, 128, (8, 16), generator=g)
            lab = padded_labels(b)
            loss = pm.step(b, target=lab, loss_fn=lm_loss)
            ref_loss = lm_loss(reference(b), lab)
            ref_loss.backward()
            worst["loss"] = max(worst["loss"], abs(loss.item() - ref_loss.item()))
        worst["grad"] = max(worst["grad"], _diff(pm, reference, grads=True))
        for o, s in zip(opts, scheds):
            o.step(); s.step(); o.zero_grad(set_to_none=False)
    worst["params"] = _diff(pm, reference, grads=False)
    worst["wpe_frozen_equal"] = torch.equal(reference.transformer.wpe.weight, model.transformer.wpe.weight)
    worst["kind"] = type(pm).__name__
    try:
        torch.nn.utils.clip_grad_norm_(pm.parameters(), 1.0)
        worst["torch_clip"] = "no error (local norm!)"
    except Exception as e:
        worst["torch_clip"] = f"{type(e).__name__}: {str(e)[:80]}"
    return worst


if __name__ == "__main__":
    for mesh in ({"pp": 2, "dp": 2},):
        res = spawn(body, 4, mesh, timeout_s=900)
        for r, x in enumerate(res):
            print(mesh, "rank", r, x)
