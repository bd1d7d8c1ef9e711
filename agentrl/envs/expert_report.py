"""Moved to `agentrl.envs.checks.expert_report` (the checks of envs/ live in `agentrl.envs.checks`); this module
re-exports its names so that imports of `agentrl.envs.expert_report` keep working."""
from agentrl.envs.checks.expert_report import (
    SplitReport,
    expert_reports,
    report_json,
    report_split,
    task_options,
)

__all__ = ["SplitReport", "expert_reports", "report_json", "report_split", "task_options"]
