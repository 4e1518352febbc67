"""Planner: strategy spaces, pricing, the ILP and the `Plan` (see api.py for the pipeline)."""
from .api import Explanation, build, explain, plan
from .plan import CostBreakdown, EdgePlan, Fallback, NodePlan, ParamPlan, Plan, SolverReport
from .pipeline import PipelinePlan, RankCost, SearchReport, StageKindSummary, StageSpec
from .schedules import SCHEDULES
from .search import plan_pipeline

__all__ = ["plan", "explain", "build", "Explanation", "Plan", "NodePlan", "EdgePlan", "ParamPlan",
           "CostBreakdown", "SolverReport", "Fallback",
           "plan_pipeline", "PipelinePlan", "StageSpec", "RankCost", "StageKindSummary", "SearchReport", "SCHEDULES"]
