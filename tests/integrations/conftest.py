"""Fixtures of the TRL integration tests."""

from __future__ import annotations

import os
import sys

import pytest

from .trl_runs import Runs

# TRL supports Python 3.11 and later, so the dev extra installs it only there (pyproject.toml's markers): on
# 3.10 the TRL tests are not collected (docs/dependencies.md, "Python versions")
collect_ignore_glob = ["test_*.py"] if sys.version_info < (3, 11) else []


@pytest.fixture(scope="session")
def trl_runs(tmp_path_factory) -> Runs:
    base = tmp_path_factory.getbasetemp()
    # under xdist each worker has its own basetemp (popen-gw<N>); their parent is the session's
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    return Runs(root / "trl_runs")
