"""Finding 2: Mixtral with output_router_logits=True (its own loss = cross-entropy + 0.02 x router
load-balancing loss) on pp=2 x dp=2. pm.step(ids, labels=labels) raises StepError (the loss op is an add whose
count the graph does not show) and its remedy says: pass target= and item_count=. Following it
(target=labels, item_count=shifted non-ignored labels) runs without a word, but the batch loss and the
gradients are not one device's: the load-balancing loss is a product of two means over the batch's tokens,
not a mean of per-token terms, so weighting the per-microbatch values by n_j / N gives another number (what
eager gradient accumulation over the same microbatches computes). This script prints the three numbers on one
process (no ranks needed): whole batch, and the n_j / N-weighted microbatch sum that pm.step returns
(trial/batch2.py mixtral_aux_remedy runs it on 4 ranks: loss 4.904533 vs one device 4.904525, gradient ratio
234 to the fp32 bound)."""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
from harness import build

if __name__ == "__main__":
    model, (ids,), kw = build("mixtral_aux")
    labels = kw["labels"]
    with torch.no_grad():
        whole = model(ids, labels=labels)
        n = [(labels[4 * j:4 * j + 4, 1:] != -100).sum().item() for j in range(2)]
        parts = [model(ids[4 * j:4 * j + 4], labels=labels[4 * j:4 * j + 4]) for j in range(2)]
        weighted = sum(p.loss * n[j] / sum(n) for j, p in enumerate(parts))
        ce_weighted = sum((p.loss - 0.02 * p.aux_loss) * n[j] / sum(n) for j, p in enumerate(parts))
    print(f"one device, whole batch: loss {whole.loss.item():.6f} (aux {whole.aux_loss.item():.6f})")
    print(f"n_j/N-weighted microbatches (pm.step with the remedy): {weighted.item():.6f} "
          f"(aux per microbatch {[round(p.aux_loss.item(), 6) for p in parts]})")
    print(f"cross-entropy part alone: whole {(whole.loss - 0.02 * whole.aux_loss).item():.6f} "
          f"weighted {ce_weighted.item():.6f}")
