"""Fixtures of the TRL integration tests."""

from __future__ import annotations

import os

import pytest

from .trl_runs import Runs


@pytest.fixture(scope="session")
def trl_runs(tmp_path_factory) -> Runs:
    base = tmp_path_factory.getbasetemp()
    # under xdist each worker has its own basetemp (popen-gw<N>); their parent is the session's
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    return Runs(root / "trl_runs")
