"""`PlanConfig`: every knob of `parallelizer.plan`, in one frozen, validated object (no globals)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from cost_model.compression import POWERSGD_DEFAULT_WARMUP
from cost_model.memory import OPTIMIZERS, PRECISIONS

from .errors import ConfigError

AXIS_ROLES = ("auto", "ddp", "fsdp", "tp")
COMPRESSION_OPTIONS = ("none", "auto", "bf16", "powersgd")
SOLVERS = ("highs", "cbc")


@dataclass(frozen=True, slots=True)
class PlanConfig:
    """Planner configuration.

    Attributes:
        batch_dims: the batch dim of each user input (placeholder name -> dim, or None for "not batched");
            inputs not named use `default_batch_dim`. Batch dims may be sharded over `data_axes`.
        default_batch_dim: batch dim of user inputs not in `batch_dims` (0 by default; None = no batch dim).
        data_axes: mesh axes user inputs may be sharded over (None = every axis not given the role "tp").
        axis_roles: mesh axis -> the parallelism it must carry (axes not named are "auto": the ILP decides):
            "ddp": batch dims of user inputs sharded over the axis, parameters stored and used Replicate over
                it (DistributedDataParallel: one gradient all-reduce per parameter);
            "fsdp": batch dims sharded over the axis, parameters stored Shard over it and all-gathered for use
                (ZeRO-3/FSDP: reduce-scatter of gradients); a parameter none of whose dims divides by the
                axis size stays Replicate (FSDP pads instead; we do not);
            over "ddp" and "fsdp" axes activations are never gathered (the compute stays data parallel),
                except into the model's outputs and into ops without a sharding rule (`plan.fallbacks`);
            "tp": user inputs Replicate over the axis (no data parallelism on it), parameters of 2 or more
                dims stored Shard over it (Megatron tensor parallelism; the ILP picks the dim, i.e. column or
                row parallel, and how activations are laid out); 1-D parameters (biases, norm weights) free.
        memory_budget_bytes: per-device memory the plan may occupy, reserve included; None = the device's
            memory (`DeviceSpec.hbm_bytes`).
        memory_reserve_bytes: bytes of that budget kept out of the plan's tensors (allocator fragmentation,
            cuBLAS/NCCL workspaces, communication buffers; `cost_model.reserve`). None = the default: with
            `memory_budget_bytes` None, `cost_model.reserve.default_reserve_bytes(device)` (10% of a GPU's
            memory + 1 GB; 0 on a calibrated CPU); with an explicit budget 0 (the budget you give is what the
            plan's tensors may hold). The plan records the reserve applied (`Plan.config`).
        optimizer: "adamw" / "adam" or "sgd" (momentum 0), for training-state bytes
            (`cost_model.memory.BYTES_PER_PARAM`).
        precision: "bf16" = bf16 parameters and activations with fp32 main weights and fp32 main gradients
            (reduced in fp32) plus Adam m, v: 18 B/param, FLOPs at the device's bf16 peak, activations 2 B per
            element (fp32 statistics stay fp32); "fp32" = fp32 everything, 16 B/param. None = the default:
            "bf16" on a GPU, "fp32" on a calibrated CPU (`DeviceSpec.kind`), "bf16" for a graph traced with
            bf16 parameters. A graph traced in fp32 is priced in bf16 as if autocast to it
            (`planner.costs.Pricer`); the plan records the precision applied. "bf16" given explicitly for a
            graph traced in fp32 also makes the runtime run it: `Plan.config["mixed_precision"]` =
            "autocast_bf16" (`runtime.precision`: torch.autocast to bf16, fp32 weights and gradients); a
            precision only defaulted prices bf16 and runs the traced dtypes.
        time_limit_s: solver wall-clock limit, seconds (> 0).
        mip_rel_gap: relative MIP gap at which the solver may stop (0 = prove optimality).
        solver: "highs" (default; falls back to "cbc" if highspy is missing) or "cbc".
        recompute: activation recomputation per repeated-block member (`planner.recompute`): "auto" (default)
            = the planner decides with the layout, by time: the fastest plan that fits, recomputing where
            that makes a faster layout fit or where nothing fits without it (ties: none; `planner.ilp.solve`,
            `planner.search`); "none", "selective" or "full" force
            that mode on every member. A user's own checkpoint regions (`traced.user_recompute`) stay forced.
        boundary_compression: compression of the activations and activation gradients sent between pipeline
            stages (`planner.boundary`, `core.boundary_codec`): "none" (default; lossy numerics are opt-in),
            "auto" (the search picks int8 per boundary where it lowers the estimated step by >= 5%), "int8" or
            "lowrank" (forced on every boundary). Pipeline plans only.
        boundary_rank: subspace rank r of the "lowrank" boundary codec (>= 1).
        cluster_blocks: share strategy variables between the instances of a repeated block (exact when the
            optimum treats every instance alike; always a feasible plan).
        compression: data-parallel gradient compression (`cost_model.compression`, `rewriter.compression`),
            applied to the bucketed all-reduces of replicated (DDP) parameters' gradients only: "none" (default:
            a lossy codec is opt-in), "bf16" (bf16 all-reduce), "powersgd" (rank `powersgd_rank`, error
            feedback, warm start), or "auto" = the planner picks the cheapest estimated step
            (`planner.search`). FSDP reduce-scatters and activation collectives are never compressed.
        powersgd_rank: PowerSGD's approximation rank r (>= 1; Vogels et al. 2019 use 1-4).
        zero1: a mesh axis over which each parameter's optimizer state is partitioned (ZeRO stage 1,
            Rajbhandari et al. SC'20 Sec. 5.1: P_os), or None (default: every rank keeps all of it). The axis
            carries the role "ddp" (given so, or "auto" taken as "ddp": parameters Replicate over it, the batch
            sharded); each of its N ranks keeps 1/N of the optimizer state and, after its step, broadcasts the
            parameters it stepped (`planner.costs.Pricer`: optimizer bytes / N, and an all-gather's time of the
            local parameters per step). ZeroRedundancyOptimizer partitions whole tensors greedily by size, so
            with one dominant tensor the largest rank holds more than 1/N. Run it with torch's
            ZeroRedundancyOptimizer over `pm.process_group(axis)` (`runtime/zero1.py`).
        powersgd_warmup: optimizer steps all-reduced exactly before PowerSGD starts (>= 0; torch's
            `PowerSGDState.start_powerSGD_iter`, whose default 1000 this is; torch's docs advise about 10% of the
            run's steps: early training is sensitive to inexact gradients). `rewriter.compression`.
    Raises:
        ValueError: naming the field, the value declared and what is required.
    """

    batch_dims: tuple[tuple[str, int | None], ...] = field(default=())
    default_batch_dim: int | None = 0
    data_axes: tuple[str, ...] | None = None
    axis_roles: tuple[tuple[str, str], ...] = field(default=())
    memory_budget_bytes: int | None = None
    memory_reserve_bytes: int | None = None
    optimizer: str = "adamw"
    precision: str | None = None
    time_limit_s: float = 60.0
    mip_rel_gap: float = 0.0
    solver: str = "highs"
    cluster_blocks: bool = True
    recompute: str = "auto"
    compression: str = "none"
    powersgd_rank: int = 4
    powersgd_warmup: int = POWERSGD_DEFAULT_WARMUP
    boundary_compression: str = "none"
    boundary_rank: int = 8
    zero1: str | None = None

    def __post_init__(self) -> None:
        bd = self.batch_dims
        if isinstance(bd, dict):
            bd = tuple(sorted(bd.items()))
        object.__setattr__(self, "batch_dims", tuple(tuple(x) for x in bd))
        if self.data_axes is not None:
            object.__setattr__(self, "data_axes", tuple(self.data_axes))
        roles = self.axis_roles if self.axis_roles is not None else ()  # None: no roles (as the default)
        if isinstance(roles, dict):
            roles = tuple(sorted(roles.items(), key=str))
        if isinstance(roles, str) or not isinstance(roles, (tuple, list)) or not all(
                isinstance(x, (tuple, list)) and len(x) == 2 for x in roles):
            raise ConfigError(f"PlanConfig.axis_roles={self.axis_roles!r}: give a dict of mesh axis name -> role, "
                             "e.g. {'dp': 'fsdp', 'tp': 'tp'}")
        object.__setattr__(self, "axis_roles", tuple(tuple(x) for x in roles))
        axes = [axis for axis, _ in self.axis_roles]
        if len(set(axes)) != len(axes) or not all(isinstance(a, str) for a in axes):
            raise ConfigError(f"PlanConfig.axis_roles={dict(self.axis_roles)!r}: axes must be distinct mesh axis "
                             "names (strings), e.g. {'dp': 'fsdp', 'tp': 'tp'}")
        for axis, role in self.axis_roles:
            if role not in AXIS_ROLES:
                raise ConfigError(f"PlanConfig.axis_roles[{axis!r}]={role!r}: use one of {AXIS_ROLES}")
            if self.data_axes is not None and (role == "tp") == (axis in self.data_axes) and role != "auto":
                raise ConfigError(f"PlanConfig.axis_roles[{axis!r}]={role!r} contradicts data_axes={self.data_axes}: "
                                 "a 'ddp'/'fsdp' axis must be a data axis and a 'tp' axis must not; drop data_axes "
                                 "(roles imply it) or make them agree")
        if self.zero1 is not None and (not isinstance(self.zero1, str)
                                       or dict(self.axis_roles).get(self.zero1, "auto") not in ("auto", "ddp")):
            raise ConfigError(f"PlanConfig.zero1={self.zero1!r}: give the name of the data-parallel mesh axis to "
                             "partition the optimizer state over (e.g. 'dp'), whose role is 'ddp' or 'auto' (an "
                             "'fsdp' axis already shards the state with the parameters; a 'tp' axis holds other "
                             "pieces on each rank)")
        if self.precision is not None and self.precision not in PRECISIONS:
            raise ConfigError(f"PlanConfig.precision={self.precision!r}: use one of {PRECISIONS} or None (the "
                             "device's default: bf16 on a GPU, fp32 on a calibrated CPU)")
        if self.memory_reserve_bytes is not None and not (
                isinstance(self.memory_reserve_bytes, int) and self.memory_reserve_bytes >= 0):
            raise ConfigError(f"PlanConfig.memory_reserve_bytes={self.memory_reserve_bytes!r}: must be an int of "
                             "bytes >= 0 or None (the default reserve)")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"PlanConfig.optimizer={self.optimizer!r}: use one of {OPTIMIZERS}")
        from .planner.recompute import RECOMPUTE_OPTIONS  # here: the planner package imports this module
        if self.recompute not in RECOMPUTE_OPTIONS:
            raise ConfigError(f"PlanConfig.recompute={self.recompute!r}: use one of {RECOMPUTE_OPTIONS}")
        if self.compression not in COMPRESSION_OPTIONS:
            raise ConfigError(f"PlanConfig.compression={self.compression!r}: use one of {COMPRESSION_OPTIONS}")
        if not (isinstance(self.powersgd_rank, int) and not isinstance(self.powersgd_rank, bool)
                and self.powersgd_rank >= 1):
            raise ConfigError(f"PlanConfig.powersgd_rank={self.powersgd_rank!r}: must be an int >= 1 (e.g. 4)")
        if not (isinstance(self.powersgd_warmup, int) and not isinstance(self.powersgd_warmup, bool)
                and self.powersgd_warmup >= 0):
            raise ConfigError(f"PlanConfig.powersgd_warmup={self.powersgd_warmup!r}: must be an int >= 0 (optimizer "
                             "steps before PowerSGD starts, e.g. 10% of the run's steps)")
        from .planner.boundary import OPTIONS as BOUNDARY_OPTIONS
        if self.boundary_compression not in BOUNDARY_OPTIONS:
            raise ConfigError(f"PlanConfig.boundary_compression={self.boundary_compression!r}: use one of "
                             f"{BOUNDARY_OPTIONS}")
        if not (isinstance(self.boundary_rank, int) and self.boundary_rank >= 1):
            raise ConfigError(f"PlanConfig.boundary_rank={self.boundary_rank!r}: must be an int >= 1")
        if self.solver not in SOLVERS:
            raise ConfigError(f"PlanConfig.solver={self.solver!r}: use one of {SOLVERS}")
        if not (isinstance(self.time_limit_s, (int, float)) and self.time_limit_s > 0):
            raise ConfigError(f"PlanConfig.time_limit_s={self.time_limit_s!r}: must be seconds > 0")
        if not (isinstance(self.mip_rel_gap, (int, float)) and 0 <= self.mip_rel_gap < 1):
            raise ConfigError(f"PlanConfig.mip_rel_gap={self.mip_rel_gap!r}: must be in [0, 1)")
        if self.memory_budget_bytes is not None and not (
                isinstance(self.memory_budget_bytes, (int, float)) and self.memory_budget_bytes > 0):
            raise ConfigError(f"PlanConfig.memory_budget_bytes={self.memory_budget_bytes!r}: must be bytes > 0 "
                             "or None (= device memory)")

    @classmethod
    def from_record(cls, record: dict) -> "PlanConfig":
        """The config recorded in a plan (`Plan.config`, JSON form); fields it lacks keep their defaults."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in names})

    def role_of(self, axis: str) -> str:
        """The role of mesh axis `axis` ("auto" when not named in `axis_roles`; "ddp" for the `zero1` axis)."""
        return dict(self.axis_roles).get(axis, "ddp" if axis == self.zero1 else "auto")

    def roles_on(self, axis_names: tuple[str, ...]) -> list[str]:
        """The role of each of `axis_names` (a mesh's axes, in order)."""
        return [self.role_of(a) for a in axis_names]

    def batch_dim_of(self, input_name: str) -> int | None:
        """The batch dim of user input `input_name`."""
        return dict(self.batch_dims).get(input_name, self.default_batch_dim)
