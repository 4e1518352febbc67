"""Finding (typed error, misleading text): weight_norm parametrized Linears (H=32 -> 64 -> 32, every dim even)
on {"dp": 2, "tp": 2} with roles fsdp/tp: ValueError said "no parameter dim divides by 2"; the cause is
that aten._weight_norm has no sharding rule (on {"tp": 2} alone it plans, storing the weights replicated)."""
import contextlib, io, warnings
warnings.filterwarnings("ignore")
import parallelizer
from patterns import weight_norm

m, a = weight_norm()
tr = parallelizer.trace(m, a)
for mesh, roles in (({"tp": 2}, {"tp": "tp"}), ({"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"})):
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            p = parallelizer.plan(tr, mesh, axis_roles=roles)
        print(mesh, "planned; fallbacks", [f.node for f in p.fallbacks])
    except Exception as e:
        print(mesh, type(e).__name__, e)
