"""Finding h3-2 (untyped crash): XLM / Flaubert forward runs `assert lengths.max().item() <= slen`. Export
records max -> item -> operator.le -> _assert_scalar; the tracer dropped only the assert node, and the planner's
pricer then met the SymBool node with a bare StopIteration (costs._local_values) on every mesh. A `.item()`
whose number feeds the computation crashed the same way. Prints what plan does for both."""
import sys, os
sys.path.insert(0, os.path.dirname(__file__))
import torch
import h3_models as M
import parallelizer


class ItemUsed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        return h / h.abs().max().item()


if __name__ == "__main__":
    for name, build in (("xlm", lambda: M.build("xlm")), ("item used", lambda: (ItemUsed(), (torch.randn(4, 4),), {}))):
        model, args, kwargs = build()
        try:
            plan = parallelizer.plan(parallelizer.trace(model, args, kwargs), {"dp": 2}, axis_roles={"dp": "ddp"})
            print(name, "planned")
        except Exception as e:
            print(name, f"{type(e).__module__}.{type(e).__name__}:", str(e).splitlines()[0][:200] if str(e) else "")
