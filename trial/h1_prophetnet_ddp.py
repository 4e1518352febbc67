"""Trial h1: ProphetNet (decoder_input_ids given) under forced ddp dp=2 is an InfeasiblePlanError naming
slice_12 -> linear_38; prints those nodes and their source lines."""
import sys, os, warnings
sys.path.insert(0, os.path.dirname(__file__))
import parallelizer
import h1_models as M

if __name__ == "__main__":
    warnings.simplefilter("ignore")
    m, a, k = M.build("prophetnet_dec")
    t = parallelizer.trace(m, a, k)
    gm = t.exported.graph_module if hasattr(t.exported, "graph_module") else None
    for n in gm.graph.nodes:
        if n.name in ("slice_12", "linear_38") or (n.name.startswith("slice_1") and len(n.name) <= 8):
            line = (n.meta.get("stack_trace") or "").strip().splitlines()[-1:] 
            print(n.name, n.target, [str(x) for x in n.args], n.meta.get("val").shape if hasattr(n.meta.get("val"), "shape") else "", line)
    node = next(n for n in gm.graph.nodes if n.name == "linear_38")
    for _ in range(4):
        node = node.args[0]
        print("  <-", node.name, node.target, [str(x) for x in node.args], tuple(node.meta["val"].shape), (node.meta.get("stack_trace") or "").strip().splitlines()[-1:])
    try:
        parallelizer.plan(t, {"dp": 2}, axis_roles={"dp": "ddp"})
        print("planned")
    except Exception as e:
        print(type(e).__name__, str(e)[:1500])
