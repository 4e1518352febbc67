"""transformers' own initialiser through pm.apply: `pm.apply(model._init_weights)` (GPT-2 with tied wte/lm_head,
Llama with GQA and its rotary inv_freq buffer) on ddp, fsdp, tp=2, then one step: against eager."""
import contextlib, copy, io, sys, warnings
import torch
import torch.distributed as dist

import parallelizer
from parallelizer import zoo
from parallelizer.rewriter.spec import spec_from_plan, all_axis_groups
from parallelizer.rewriter.state import shard_tensor
from parallelizer.runtime import create_groups, spawn
from parallelizer.runtime.module import ParallelModule
from parallelizer.tracer.trace import trace

BUILD = {"gpt2": lambda: zoo.gpt2(n_layer=2, n_embd=32, n_head=2, vocab_size=100, batch=4, seq_len=8),
         "llama": lambda: zoo.llama(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                    intermediate_size=64, vocab_size=100, batch=4, seq_len=8)}
MESHES = {"ddp": ({"dp": 2}, {"dp": "ddp"}), "fsdp": ({"dp": 2}, {"dp": "fsdp"}), "tp": ({"tp": 2}, {"tp": "tp"})}


def body(rank, world, specs):
    warnings.simplefilter("ignore")
    out = {}
    for (mname, sname), spec in specs.items():
        model, inputs = BUILD[mname]()
        ref = copy.deepcopy(model)
        create_groups(all_axis_groups(spec.mesh))
        pm = ParallelModule(trace(model, inputs), spec, dist.get_rank(), model)
        try:
            for m, init in ((pm, model._init_weights), (ref, ref._init_weights)):
                torch.manual_seed(11)
                m.apply(init)
                m(*inputs).logits.float().pow(2).mean().backward()
            full = dict(ref.named_parameters())
            d = max(max((p - shard_tensor(full[f].detach(), spec.params[f], spec.mesh, pm.coords)).abs().max().item(),
                        (p.grad - shard_tensor(full[f].grad, spec.params[f], spec.mesh, pm.coords)).abs().max().item())
                    for f, p in pm.named_parameters())
            out[(mname, sname)] = f"params+grads max diff {d:.3g}"
        except Exception as e:
            out[(mname, sname)] = f"{type(e).__name__}: {str(e)[:200]}"
        dist.barrier()
    return out


if __name__ == "__main__":
    specs = {}
    for mname, build in BUILD.items():
        model, inputs = build()
        for sname, (mesh, roles) in MESHES.items():
            with contextlib.redirect_stdout(io.StringIO()):
                specs[(mname, sname)] = spec_from_plan(parallelizer.plan(parallelizer.trace(model, inputs), mesh,
                                                                         axis_roles=roles))
    for k, v in spawn(body, 2, specs, timeout_s=600)[0].items():
        print(k, v)
