"""Finding h3-4 (reported mismatch, class NOT found yet): Wav2Vec2-Conformer (relative and rotary position
embeddings, sequence classification, dropouts 0, mask_time_prob 0) differs from one device on EVERY mesh
alike (ddp dp=2, tp=2, tp=3, fsdp 2x2, random costs): outputs 2e-3, grads 1e-2 (classifier.weight), params
after 2 steps 0.1 (conv_module.batch_norm). The eager model itself gives different outputs on each call with
the same inputs and weights (below: 2.6e-3 between calls 1 and 2, 1.8e-3 between 2 and 3), so state that the
forward changes is read by the next call, and the tracer's state watch says nothing (no note). The traced
program freezes one call's view of it. Lead: find which tensor forward mutates outside the registered
buffers (BatchNorm running stats are buffers and only matter in eval)."""
import sys, os
sys.path.insert(0, os.path.dirname(__file__))
import h3_models as M
import parallelizer

if __name__ == "__main__":
    model, args, kwargs = M.build("w2v2conformer_rel")
    outs = [model(*args, **kwargs).logits for _ in range(3)]
    print("eager call 1 vs 2:", (outs[0] - outs[1]).abs().max().item(), " 2 vs 3:", (outs[1] - outs[2]).abs().max().item())
    model, args, kwargs = M.build("w2v2conformer_rel")
    traced = parallelizer.trace(model, args, kwargs)
    print("tracer notes about state:", [n for n in traced.notes if "state" in n or "attribute" in n] or "none")
