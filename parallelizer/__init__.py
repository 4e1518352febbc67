"""parallelizer: trace a PyTorch model, price it, plan hybrid sharding with an ILP, emit sharded programs.

Public API (see README.md):
    trace(model, example_inputs, example_kwargs=None, *, allow_frozen_host_random=False) -> TracedGraph
    plan(traced, mesh=None, *, cluster=None, global_batch=None, retrace=None, schedule=None, **options) -> Plan
        (THE planner: without a mesh, or with "pp" first, a search over (pp, dp, tp), schedule and
        microbatches; on a mesh without pp the ILP; plus provenance: fingerprint, cluster, blocks; api.py)
    explain(traced, plan, node, ...) -> Explanation
    auto_parallelize(model, example_inputs, *, mesh=None, cluster=None, ...) -> ParallelModule (with .plan;
        auto_parallel.py),
        or for a mesh with "pp" a runtime.pipeline_module.PipelineModule; both train with
        loss = pm.step(*inputs, target=..., loss_fn=...)
    Plan.save(path) / Plan.load(path, traced=None, mesh=None); check_plan(plan, traced, mesh) -> PlanMismatchError
    plan_pipeline(traced, cluster, *, global_batch, ...) -> PipelinePlan   (the search engine behind plan():
        its full report, for studies; its answer cannot be saved, applied or rehearsed: use plan())
    rewrite(traced, plan, rank) -> RankProgram                      (the sharded fx program of one rank)
    ParallelModule(traced, spec, rank, model)                       (a rank's program with its local shards;
        train()/eval(), clip_grad_norm_, full_state_dict / load_full_state_dict)
    parallelizer.checkpoint.save / load / export_full_state_dict    (sharded checkpoints through DCP)
"""
from .errors import (CheckpointFilesError, ConfigError, InfeasiblePlanError, MicrobatchWarning, ModelAttributeError, NoParallelismWarning, OptimizerError, ParallelizerError, PlanMismatchError, InputMismatchError, ConstantInputError, PlanValidationError,
                     PrecisionError, StaleModelWarning, StateDictError, TraceError, UnsupportedOpError, WrapperError)
from .tracer import BlockGroup, NodeInfo, ParamInfo, Role, TensorMeta, TracedGraph, trace
from .config import PlanConfig
from .core import Layout, MeshSpec
from .planner import PipelinePlan, Plan, explain, plan_pipeline
from .fingerprint import check_plan, graph_fingerprint
from .api import plan
from .auto_parallel import auto_parallelize
from .rewriter import rewrite
from .runtime.module import ParallelModule
from .runtime.optimizer_check import install as _check_optimizer_steps

# in every process that imports the package, not only where a parallel module is built: a rank's optimizer state
# loaded into an optimizer on one device in a new process (resuming there) is refused before it steps
# (`runtime.shard_origin.check_optimizer`; before, torch's size mismatch mid-step, trial r14c)
_check_optimizer_steps()

__all__ = [
    "trace", "TracedGraph", "NodeInfo", "ParamInfo", "BlockGroup", "Role", "TensorMeta",
    "plan", "explain", "Plan", "plan_pipeline", "PipelinePlan", "PlanConfig", "MeshSpec", "Layout",
    "rewrite", "ParallelModule",
    "auto_parallelize", "check_plan", "graph_fingerprint",
    "ParallelizerError", "TraceError", "UnsupportedOpError", "InfeasiblePlanError", "PlanMismatchError", "InputMismatchError", "ConstantInputError",
    "PlanValidationError", "StateDictError", "CheckpointFilesError", "PrecisionError", "OptimizerError", "WrapperError",
    "ModelAttributeError", "ConfigError",
    "NoParallelismWarning", "MicrobatchWarning", "StaleModelWarning",
]
