"""Finding (trial5a h1): forward writes its input in place (`x.mul_(2)`); under ddp/fsdp each rank wrote only
its batch rows of the caller's tensor ('x after' differs from eager by ~3), outputs/grads equal. Fixed in
914956d (the input stays Replicate; with no other batch input a ddp axis is a typed ValueError).
    python trial/h1_input_written.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from h1_autograd import main_for  # noqa: E402

if __name__ == "__main__":
    main_for(["input_mutation"])
