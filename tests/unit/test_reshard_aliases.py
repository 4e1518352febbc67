"""`tracer.graph.UNDECLARED_ALIASES`: every op listed returns its input or a view of it for some arguments
although its schema declares no alias (checked in eager), and `may_alias` flags it; ops that return fresh
tensors are not flagged (einsum is flagged whatever its equation: a contraction is then both an alias and a
consumer of a gathered weight in `rewriter.reshard`, kept until its readers are done and re-gathered for its
backward)."""
import torch
import torch.fx

from parallelizer.tracer.graph import UNDECLARED_ALIASES, may_alias

aten = torch.ops.aten
A = torch.randn(4, 4)
SAMPLES = {  # packet -> (overload, args) whose output shares A's storage
    aten.einsum: (aten.einsum.default, ("ii->i", [A])),
    aten.type_as: (aten.type_as.default, (A, A)),
    aten.atleast_1d: (aten.atleast_1d.default, (A,)),
    aten.atleast_2d: (aten.atleast_2d.default, (A,)),
    aten.atleast_3d: (aten.atleast_3d.default, (A.view(1, 4, 4),)),
    aten.sum_to_size: (aten.sum_to_size.default, (A, [4, 4])),
    aten.dropout: (aten.dropout.default, (A, 0.5, False)),
    aten.feature_dropout: (aten.feature_dropout.default, (A, 0.5, False)),
    aten.alpha_dropout: (aten.alpha_dropout.default, (A, 0.5, False)),
    aten.feature_alpha_dropout: (aten.feature_alpha_dropout.default, (A, 0.5, False)),
    aten.unsafe_chunk: (aten.unsafe_chunk.default, (A, 2)),
    aten.unsafe_split: (aten.unsafe_split.Tensor, (A, 2)),
}


def _shares(out) -> bool:
    outs = out if isinstance(out, (list, tuple)) else [out]
    return any(o.untyped_storage().data_ptr() == A.untyped_storage().data_ptr() for o in outs)


def test_every_listed_op_returns_an_alias_its_schema_does_not_declare():
    assert set(SAMPLES) == set(UNDECLARED_ALIASES)
    for packet, (op, args) in SAMPLES.items():
        assert op._schema.returns[0].alias_info is None, op
        assert _shares(op(*args)), op


def test_may_alias_flags_them_and_not_fresh_results():
    graph = torch.fx.Graph()
    a = graph.placeholder("a")
    for packet, (op, args) in SAMPLES.items():
        assert may_alias(graph.call_function(op, tuple(a if x is A else x for x in args))), op
    for op, args in ((aten.matmul.default, (a, a)), (aten.clone.default, (a,)), (aten.kron.default, (a, a))):
        node = graph.call_function(op, args)
        assert not may_alias(node), op
        assert not _shares(op(*[A if x is a else x for x in args])), op
    assert may_alias(graph.call_function(aten.t.default, (a,)))  # a declared view
