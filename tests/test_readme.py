"""The README's fresh-machine commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text.split("<!-- fresh-machine -->", 2)[1]
    return re.findall(r"^```bash\n(.+?)\n```", block, flags=re.M | re.S)


def test_readme_states_exactly_two_commands_and_ci_runs_the_test_one():
    commands = readme_commands()
    assert len(commands) == 2, commands
    ci = [line for line in (REPO / ".ci/run").read_text().splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == [commands[1]]
    assert "pytest" in commands[1] and "rlprobe" in commands[0]
