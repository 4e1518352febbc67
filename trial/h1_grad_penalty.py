"""Finding (trial5a h1): a gradient penalty (autograd.grad(create_graph=True)) lost its second-order terms
across ranks: param grads off by up to 9e-2 on ddp, fsdp, tp=2, loss equal. Fixed in 914956d.
    python trial/h1_grad_penalty.py      (prints |x.grad - eager| and |param grad - eager| per rank)"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from h1_autograd import main_for  # noqa: E402

if __name__ == "__main__":
    main_for(["grad_penalty"])
