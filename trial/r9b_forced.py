"""Round 9b trial: layouts the planner did not choose for these small models, forced: a vocab-parallel embedding
with padding_idx (torchtitan #4637) and norms / a scale on sequence-sharded activations (Megatron-LM #1446)."""
import contextlib, dataclasses, io, sys, warnings
import parallelizer
from parallelizer.core.layout import Layout
from parallelizer.rewriter.spec import NodeSharding, spec_from_plan
from parallelizer.runtime.rehearsal import rehearse_many
sys.path.insert(0, "trial")
import r9b_models as M

L = Layout.parse


def forced(fn, mesh, roles, pick):
    model, inputs = fn()
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = parallelizer.plan(parallelizer.trace(model, inputs), mesh, axis_roles=roles)
    spec = spec_from_plan(plan)
    nodes = dict(spec.nodes)
    for name, n in plan.nodes.items():
        got = pick(n)
        if got:
            nodes[name] = NodeSharding(tuple(L(x) for x in got[0]), L(got[1]))
    return dataclasses.replace(spec, nodes=nodes)


if __name__ == "__main__":
    emb = lambda n: ((("S(0)", "R"), "P") if n.op == "aten.embedding.default" else None)  # noqa: E731
    seq = lambda n: ((("S(1)",) + ("R",) * (len(n.inputs) - 1), "S(1)")  # noqa: E731
                     if n.op in ("aten.layer_norm.default", "aten.rms_norm.default") else None)
    cases = [("padded_emb vocab-parallel", M.padded_emb, forced(M.padded_emb, {"tp": 2}, {"tp": "tp"}, emb)),
             ("padded_emb_low vocab-parallel", M.padded_emb_low, forced(M.padded_emb_low, {"tp": 2}, {"tp": "tp"}, emb)),
             ("seq_norm_block seq-sharded norms", M.seq_norm_block, forced(M.seq_norm_block, {"tp": 2}, {"tp": "tp"}, seq))]
    reports = rehearse_many([(fn, {}, spec) for _, fn, spec in cases])
    for (name, _, _), r in zip(cases, reports):
        print(name, "match" if r.matches() else "DIFFER", f"ratio={r.tolerance_ratio:.3g} grad={r.grad:.2e}@{r.worst_grad}",
              "masked_embedding" in r.rank0_code, "layer_norm" in r.rank0_code)
    cases4 = [("padded_emb vocab-parallel tp4", M.padded_emb, forced(M.padded_emb, {"tp": 4}, {"tp": "tp"}, emb)),
              ("seq_norm_block seq-sharded tp4", M.seq_norm_block, forced(M.seq_norm_block, {"tp": 4}, {"tp": "tp"}, seq))]
    for (name, _, _), r in zip(cases4, rehearse_many([(fn, {}, spec) for _, fn, spec in cases4])):
        print(name, "match" if r.matches() else "DIFFER", f"ratio={r.tolerance_ratio:.3g} grad={r.grad:.2e}@{r.worst_grad}")
