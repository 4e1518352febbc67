"""Pipelines over layers that are not all identical (round 15, r15d): hybrid models (Jamba, Bamba, Qwen3-Next),
dense / MoE layers alternating (Qwen3-MoE `decoder_sparse_step`, DeepSeek `first_k_dense_replace`, Llama 4
`interleave_moe_layer_step`), x-transformers' attention / feed-forward entries, and a head calling a block's
submodule (diffusers' DiT). Before, a pipeline cut only between the members of the first group of IDENTICAL
blocks: pp=4 on 4 layers of two kinds was refused ("pp=4 stages > the 2 blocks"), and a model whose largest group
was not its first was refused ("do not form one run of identical layers"). Now the cut runs between any two
consecutive layers of the stack (`tracer.blocks.layer_stack`), each layer priced by its own ops, each stage's
memory by its own layers."""
import contextlib
import io
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import parallelizer
from parallelizer.errors import PipelineError
from parallelizer.planner.segments import price_segments, segment_graph
from parallelizer.runtime.pipeline import cut_stages, plan_cut
from parallelizer.tracer.blocks import layer_stack, pipeline_unit
from cost_model.topology import get_cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from layer_kinds_models import dit_like, hybrid_lm, pixart_like  # noqa: E402


def _traced(fn, **kw):
    return parallelizer.trace(*fn(batch=2, **kw))


def test_a_stack_of_two_layer_kinds_is_the_pipeline_unit_and_identical_layers_keep_their_group():
    traced = _traced(hybrid_lm, kinds="mfmf")
    stack = layer_stack(traced)
    assert stack is not None and stack.members == ("layers.0", "layers.1", "layers.2", "layers.3"), stack
    assert pipeline_unit(traced) == stack
    dense_first = layer_stack(_traced(hybrid_lm, kinds="fmmm"))  # DeepSeek's first_k_dense_replace=1
    assert dense_first is not None and dense_first.count == 4, dense_first
    same = _traced(hybrid_lm, kinds="ffff")
    assert layer_stack(same) is None and pipeline_unit(same) == same.blocks[0]
    assert pipeline_unit(same).name == "layers.*"


class _EncDec(nn.Module):
    """Two stacks of different blocks (an encoder-decoder's shape): neither stack holds both groups."""

    def __init__(self):
        super().__init__()
        self.enc = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.dec = nn.ModuleList(nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8)) for _ in range(3))

    def forward(self, x):
        for m in self.enc:
            x = torch.relu(m(x))
        for m in self.dec:
            x = x + m(x)
        return x.sum()


def test_two_stacks_of_different_blocks_are_no_stack():
    traced = parallelizer.trace(_EncDec(), (torch.randn(4, 8),))
    assert layer_stack(traced) is None


def test_the_cut_falls_between_any_two_layers():
    traced = _traced(hybrid_lm, kinds="mfmf")
    cut = cut_stages(traced, 4)
    for name, k in cut.stage_of.items():
        fqn = traced.nodes[name].module_fqn
        if fqn.startswith("layers."):
            assert k == int(fqn.split(".")[1]), (name, fqn, k)  # layer i on stage i
        elif fqn in ("emb",):
            assert k == 0, name
        elif fqn in ("norm", "head"):
            assert k == 3, name
    cut = cut_stages(traced, 2, (1, 3))
    assert {k for n, k in cut.stage_of.items() if traced.nodes[n].module_fqn.startswith("layers.1")} == {1}


def test_a_cut_of_another_order_is_refused_on_load():
    traced = _traced(hybrid_lm, kinds="mfmf")
    cut = cut_stages(traced, 2, (1, 3))
    nodes = {k: [n for n, s in cut.stage_of.items() if s == k] for k in (0, 1)}
    stages = [{"blocks": ["layers.0"], "first_node": nodes[0][0], "last_node": nodes[0][-1]},
              {"blocks": ["layers.1", "layers.2", "layers.3"], "first_node": nodes[1][0], "last_node": nodes[1][-1]}]
    assert plan_cut(traced, stages).stage_of == cut.stage_of
    stages[1]["blocks"] = ["layers.2", "layers.1", "layers.3"]
    with pytest.raises(PipelineError, match="layers.0-3"):
        plan_cut(traced, stages)


def test_each_layer_is_priced_by_its_own_ops():
    """A mixer layer of the hybrid costs what a mixer layer of an all-mixer model costs, a feed-forward layer what
    one of an all-feed-forward model costs (the same ops at the same shapes), and the two differ."""
    cluster = get_cluster("h100:1x4")
    config = parallelizer.PlanConfig(precision="fp32")

    def prices(kinds):
        traced = _traced(hybrid_lm, kinds=kinds)
        with contextlib.redirect_stdout(io.StringIO()):
            return price_segments(traced, segment_graph(traced), 1, cluster, config)
    hybrid, mixers, ffs = prices("mfmf"), prices("mmmm"), prices("ffff")
    for seg, ref in ((1, mixers), (2, ffs), (3, mixers), (4, ffs)):
        for field in ("fwd_lin", "bwd_lin", "act_bytes", "params_bytes"):
            torch.testing.assert_close(float(getattr(hybrid, field)[seg]), float(getattr(ref, field)[1]),
                                       rtol=1e-9, atol=0.0, msg=f"segment {seg} {field}")
    assert hybrid.params_bytes[1] != hybrid.params_bytes[2] and hybrid.fwd_lin[1] != hybrid.fwd_lin[2]


def _numel(model, prefixes):
    return sum(p.numel() for n, p in model.named_parameters() if n.startswith(prefixes))


def test_each_pipeline_rank_holds_the_memory_of_its_own_layers():
    """pp=4 on layers m, m, f, m: the middle stages both hold one layer and neither end, but of different
    kinds; each rank's parameter bytes are those of its own layers (fp32: 4 bytes each), counted here from
    the model's parameters. (Stages of one kind share a summary: the feed-forward stage took the mixer's.)"""
    model, args = hybrid_lm(batch=4, kinds="mmfm")
    traced = parallelizer.trace(model, args)
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(traced, {"pp": 4}, cluster="h100:1x4", precision="fp32", schedule="gpipe",
                                 microbatches=4, global_batch=16)
    assert [s.blocks for s in plan.pipeline.stages] == [("layers.0",), ("layers.1",), ("layers.2",), ("layers.3",)]
    owned = [("emb", "layers.0."), ("layers.1.",), ("layers.2.",), ("layers.3.", "norm", "head")]
    for r, prefixes in enumerate(owned):
        assert plan.pipeline.estimate.rank_memory_bytes[r]["params"] == 4 * _numel(model, prefixes), r


def test_a_head_calling_a_blocks_submodule_holds_it_as_a_tied_weight():
    """DiT's head calls `transformer_blocks[0].norm1.emb`: the first block is a stage member (before, the group
    left it out, so pp=4 on 4 blocks was refused), and the head's call runs on the last stage, which holds that
    embedding's weights too (summed gradients, as a tied embedding / lm_head)."""
    traced = _traced(dit_like)
    assert pipeline_unit(traced).members == tuple(f"transformer_blocks.{i}" for i in range(4))
    cut = cut_stages(traced, 4)
    weight = traced.parameters["transformer_blocks.0.norm1.emb.lin.weight"]
    assert sorted({cut.stage_of[u] for u in weight.uses}) == [0, 3]
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(traced, {"pp": 4}, schedule="gpipe", microbatches=4)
    assert plan.pipeline.blocks_per_stage == (1, 1, 1, 1)


class _ProjectedStack(nn.Module):
    """An input projection and an output head of the same shape at the root, around 4 identical layers: the two
    Linears form a repeated group of their own (the first in graph order), which encloses the layers."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.layers = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width)) for _ in range(4))
        self.out = nn.Linear(width, width)

    def forward(self, x):
        h = self.inp(x)
        for m in self.layers:
            h = h + m(h)
        return self.out(h).pow(2).mean()


def test_equal_root_modules_around_the_layers_are_no_pipeline_unit():
    """Round 16 (r16a): `inp` and `out` (both Linear(8, 8)) are the first repeated group, and the pipeline runtime
    took them as its unit while the search cut between the layers, so every pp plan of such a model was refused
    ("do not form one run of identical layers", naming encoder-decoders). A group whose members enclose another
    group's is no run of layers: the unit is the layers, as the search's."""
    traced = parallelizer.trace(_ProjectedStack(), (torch.randn(4, 3, 8),))
    assert traced.blocks[0].members == ("inp", "out"), traced.blocks
    assert pipeline_unit(traced).name == "layers.*"
    assert segment_graph(traced).group == "layers.*"
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(traced, {"pp": 2, "dp": 2}, cluster="a100:1x4", schedule="1f1b", microbatches=2)
    assert plan.pipeline is not None and [list(s.blocks) for s in plan.pipeline.stages] == [
        ["layers.0", "layers.1"], ["layers.2", "layers.3"]], plan.pipeline


def test_an_embedders_equal_linears_ahead_of_the_blocks_are_no_pipeline_unit():
    """Round 17 (r17b), left by round 16 (r16b): PixArt's caption projection (Wan's time / text embedders) holds two
    Linear(d, d) at small widths, a repeated group of its own ahead of the blocks. The search cut at the largest
    group (the blocks), the runtime at the first (the projection), and every pp plan was refused ("the search cut
    at block group transformer_blocks.* but the runtime cuts at the first group caption_projection.*"). A group
    of single modules wholly ahead of the largest group is no run of layers: both cut between the blocks."""
    traced = _traced(pixart_like)
    assert [g.name for g in traced.blocks] == ["caption_projection.*", "transformer_blocks.*"], traced.blocks
    assert pipeline_unit(traced).name == segment_graph(traced).group == "transformer_blocks.*"
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(traced, {"pp": 2, "dp": 2}, cluster="a100:1x4", schedule="1f1b", microbatches=2)
    assert plan.pipeline is not None and plan.pipeline.blocks_per_stage == (2, 2), plan.pipeline
    cut = cut_stages(traced, 2)
    for name, k in cut.stage_of.items():
        fqn = traced.nodes[name].module_fqn
        if fqn.startswith("caption_projection") or fqn.startswith("transformer_blocks.1."):
            assert k == 0, (name, fqn)
        elif fqn.startswith("transformer_blocks.2.") or fqn == "proj_out":
            assert k == 1, (name, fqn)


class _Mixer(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.qkv, self.o = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        return x + self.o(torch.softmax(q @ k.transpose(1, 2), -1) @ v)


class _FeedForward(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class _TwoKinds(torch.nn.Module):
    """Two layers of different kinds and no two alike anywhere (no repeated blocks at all)."""

    def __init__(self, d: int = 16, vocab: int = 40) -> None:
        super().__init__()
        self.emb, self.head = torch.nn.Embedding(vocab, d), torch.nn.Linear(d, vocab)
        self.layers = torch.nn.ModuleList([_Mixer(d), _FeedForward(d)])

    def forward(self, ids, labels):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return torch.nn.functional.cross_entropy(self.head(x).flatten(0, 1), labels.flatten())


def test_two_layers_of_different_kinds_pipeline_without_any_repeated_block():
    """Round 16 (r16e): a model whose layers are all different (two here) had no pipeline unit, so pp=2 was refused
    ("pipeline stages are cut at repeated blocks ... and this graph has none"); its ModuleList is now the stack to
    cut (`tracer.blocks.layer_stack`), pp=2 and pp=2 x dp=2 plan one layer per stage (the trial script matched one
    device on 2 and 4 gloo ranks: loss 2.4e-07, parameters 1.2e-07 after 2 SGD steps). A mesh without pp keeps the
    search of a model without blocks (no pipeline)."""
    import contextlib
    import io

    import parallelizer
    ids = torch.randint(0, 40, (4, 6))
    traced = parallelizer.trace(_TwoKinds(), (ids, ids.clone()))
    assert traced.blocks == []
    for mesh in ({"pp": 2}, {"pp": 2, "dp": 2}):
        with contextlib.redirect_stdout(io.StringIO()):
            p = parallelizer.plan(traced, mesh, microbatches=2, schedule="1f1b")
        assert [st.blocks for st in p.pipeline.stages] == [("layers.0",), ("layers.1",)], mesh
    with contextlib.redirect_stdout(io.StringIO()):
        assert parallelizer.plan(traced, {"dp": 2}).pipeline is None
