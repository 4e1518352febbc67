"""`runtime.grad_norm`'s routing of torch's norm functions: tensors of no ParallelModule keep torch's own
result; tensors that mix a module's pieces with others, or a part of a pipeline module's, raise ValueError
(one global norm cannot be formed) before any collective. The global values are checked on gloo ranks in
tests/distributed/test_contract.py (meshes) and test_step.py (pipelines)."""
import pytest
import torch

from parallelizer.core.layout import Layout
from parallelizer.core.mesh import MeshSpec
from parallelizer.errors import GradNormError
from parallelizer.runtime import grad_norm


class _Pipeline:  # stands for a PipelineModule (weakly referenced by the registry)
    def __init__(self, params):
        self._params = params

    def parameters(self):
        return iter(self._params)


def _registered(layout: str = "S(0)", pipeline=None) -> torch.nn.Parameter:
    p = torch.nn.Parameter(torch.randn(4, 3))
    grad_norm.register([("w", p, Layout.parse(layout))], MeshSpec(("tp",), (2,)), {"tp": [0, 1]},
                       pipeline=pipeline)
    p.grad = torch.randn(4, 3)
    return p


def test_tensors_of_no_module_get_torchs_own_norm():
    _registered()  # installs the routing
    tensors = [torch.randn(3, 5), torch.randn(7)]
    for norm_type in (2.0, 1.0, float("inf")):
        expected = torch.linalg.vector_norm(torch.cat([t.reshape(-1) for t in tensors]), norm_type)
        torch.testing.assert_close(torch.nn.utils.get_total_norm(tensors, norm_type), expected)


def test_a_mix_of_pieces_and_other_tensors_is_refused():
    p = _registered()
    with pytest.raises(ValueError, match="mix shards of a ParallelModule with other tensors"):
        torch.nn.utils.get_total_norm([p.grad, torch.randn(3)])
    with pytest.raises(ValueError, match="Remedy"):
        torch.nn.utils.clip_grad_norm_([p, torch.nn.Parameter(torch.randn(3))], 1.0)


def test_a_part_of_a_pipeline_modules_tensors_is_refused():
    params = []
    pm = _Pipeline(params)
    params += [_registered("R", pm), _registered("R", pm)]
    with pytest.raises(ValueError, match="not all the parameters with a gradient"):
        torch.nn.utils.get_total_norm([params[0].grad])
    with pytest.raises(ValueError, match="not all the parameters with a gradient"):
        torch.nn.utils.clip_grad_norm_(params[:1], 1.0)
    with pytest.raises(ValueError, match="not all the parameters with a gradient"):  # gradients and values mixed
        torch.nn.utils.get_total_norm([params[0].grad, params[1]])


def test_every_parameter_with_a_gradient_of_a_pipeline_module_is_clipped_by_its_norm():
    """A LoRA loop clips the trainable parameters (`[p for p in pm.parameters() if p.requires_grad]`): on a
    pipeline that is every tensor with a gradient, so the pipeline's norm is theirs (trial r19g: refused with a
    bare ValueError). Leaving out one with a gradient stays refused, typed."""
    calls = []

    class _Clipping(_Pipeline):
        def clip_grad_norm_(self, max_norm, norm_type=2.0, **_):
            calls.append(max_norm)
            return torch.tensor(0.0)

    params = []
    pm = _Clipping(params)
    params += [_registered("R", pm), _registered("R", pm), _registered("R", pm)]
    params[2].grad = None  # frozen: no gradient
    torch.nn.utils.clip_grad_norm_(params[:2], 1.0)
    assert calls == [1.0]
    with pytest.raises(GradNormError, match="not all the parameters with a gradient"):
        torch.nn.utils.clip_grad_norm_(params[:1], 1.0)
