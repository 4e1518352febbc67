"""A rank's optimizer state (pieces of sharded parameters) loaded into an optimizer on one device (trial r14c).

`opt.state_dict()` over a ParallelModule's parameters records each parameter's piece (`runtime.shard_origin`).
Resuming "on one device" from such a file, in a new process where no parallel module was ever built, gave torch's
"The size of tensor a (2) must match the size of tensor b (4)" mid-step; it is now a StateDictError before anything
steps, naming the piece and the remedy (parallelizer.checkpoint onto a one-device module). A whole-tensor piece
(ddp) loads and steps as on one device.
"""
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import torch
    import parallelizer  # nothing else of the package is used: no parallel module in this process
    from parallelizer.errors import StateDictError
    from parallelizer.runtime.shard_origin import KEY

    def saved(rows):  # what a rank's AdamW over its piece of a (4, 6) parameter saves after one step
        piece = torch.nn.Parameter(torch.ones(rows, 6))
        opt = torch.optim.AdamW([piece], lr=0.1)
        piece.grad = torch.ones_like(piece)
        opt.step()
        state = opt.state_dict()
        state["param_groups"][0][KEY] = [("w", ((4, 6), (0, 0), (rows, 6)))]
        return state

    for rows in (2, 4):
        whole = torch.nn.Parameter(torch.ones(4, 6))
        opt = torch.optim.AdamW([whole], lr=0.1)
        opt.load_state_dict(saved(rows))
        whole.grad = torch.ones_like(whole)
        try:
            opt.step()
            print(rows, "stepped", bool((whole != 1).all()))
        except StateDictError as exc:
            print(rows, "refused", bool((whole == 1).all()), str(exc))
        except RuntimeError as exc:
            print(rows, "raw", str(exc))
""")


def test_a_ranks_optimizer_pieces_are_refused_on_one_device_in_a_new_process():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    lines = {line.split(" ", 1)[0]: line for line in out.stdout.splitlines()}
    assert "2" in lines and "4" in lines, out.stdout + out.stderr
    assert lines["2"].startswith("2 refused True "), lines["2"]
    assert "piece [0:2, 0:6] of (4, 6) of 'w'" in lines["2"] and "no parallel module holds" in lines["2"]
    assert "parallelizer.checkpoint.load(pm1, opt1, dir)" in lines["2"]
    assert lines["4"] == "4 stepped True", lines["4"]  # a whole tensor (ddp's piece) resumes as on one device
