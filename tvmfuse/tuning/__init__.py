"""Tuning: MetaSchedule over tvmfuse's fused kernels, into a JSON database per target."""

from .tune import TaskPlan, plan_tasks, tune

__all__ = ["TaskPlan", "plan_tasks", "tune"]
