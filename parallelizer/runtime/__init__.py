"""Runtime: start ranks (local processes or torchrun), create mesh sub-groups, run sharded programs."""
from ..errors import RankCrashWarning
from .launch import DistInfo, DistributedError, create_groups, init_from_env, shutdown, spawn

__all__ = ["spawn", "init_from_env", "shutdown", "create_groups", "DistInfo", "DistributedError", "RankCrashWarning"]
