"""What a test does when a system package it needs is missing (imported by name: every test directory
has tests/ on its path, while `conftest` names differ per directory)."""
from __future__ import annotations

import os

import pytest


def missing_system_tool(reason: str) -> None:
    """Skip a test that needs a system package this machine lacks (bubblewrap, MariaDB), with the reason;
    in CI (CI=true), where .ci/run installs them, the same absence fails the test."""
    if os.environ.get("CI"):
        pytest.fail(f"CI machine: {reason}")
    pytest.skip(reason)
