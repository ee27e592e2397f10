"""The shell blocks of the docs (README.md, docs/*.md, pipelines/README.md) and the commands in the
headers of pipelines/*.yaml, read as a reader would copy them, and run as written for tests/test_readme.py.

A ```bash block is a script; a ```console block is a transcript: its `$ ` lines are the commands, the
other lines their output. A command's exit status is 0 unless a comment on it says otherwise
(`# exit 1: a check failed`, `# PNG plots; exit 1 when anything diverges`: the numbers after `exit`).
A block that cannot run here has `<!-- not run: REASON -->` on the line above it.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC_FILES = ["README.md", *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md")),
             "pipelines/README.md"]
SHELL = ("bash", "console", "sh", "shell")
NOT_RUN = re.compile(r"^<!-- not run:(.*)-->$")
FENCE = re.compile(r"^```(\S*)\s*$")


@dataclass
class Block:
    file: str
    line: int  # of the opening fence (1-based)
    lang: str
    text: str
    not_run: str | None  # the marker's reason
    output: list[str]  # console blocks: the transcript's output lines

    @property
    def name(self) -> str:
        return f"{self.file}:{self.line}"

    def commands(self) -> str:
        """The script: a bash block's text, a console block's `$ ` lines."""
        if self.lang != "console":
            return self.text
        return "\n".join(line[2:] for line in self.text.splitlines() if line.startswith("$ "))


def doc_blocks(file: str) -> list[Block]:
    """Every fenced block of `file`, with the not-run marker above it."""
    lines = (REPO / file).read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "```")
        body = lines[i + 1:end]
        above = lines[i - 1].strip() if i else ""
        marker = NOT_RUN.match(above)
        output = [line for line in body if not line.startswith("$ ")] if m.group(1) == "console" else []
        blocks.append(Block(file, i + 1, m.group(1), "\n".join(body), marker.group(1).strip() if marker else None,
                            output))
        i = end + 1
    return blocks


def not_run_markers(file: str) -> list[int]:
    """Lines (1-based) of every not-run marker in `file`, wherever it stands."""
    lines = (REPO / file).read_text(encoding="utf-8").splitlines()
    return [n + 1 for n, line in enumerate(lines) if "not run:" in line and line.strip().startswith("<!--")]


def yaml_header_blocks() -> list[Block]:
    """The commands in each pipelines/*.yaml header (`#   command`, continued by `#     ...`)."""
    blocks = []
    for path in sorted((REPO / "pipelines").glob("*.yaml")):
        commands = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.startswith("#"):
                break
            if line.startswith("#   "):
                commands.append(line[4:])
        if commands:
            blocks.append(Block(path.relative_to(REPO).as_posix(), 1, "bash", "\n".join(commands), None, []))
    return blocks


def logical_commands(script: str) -> list[tuple[str, list[int]]]:
    """The script's commands with the exit statuses each may end with: lines joined while one ends in a
    backslash or a double quote is open; the statuses are the numbers of a `# exit ...` comment, else 0."""
    commands, current = [], []
    for line in script.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current.append(line)
        joined = "\n".join(current)
        if line.endswith("\\") or len(re.findall(r'(?<!\\)"', joined)) % 2:
            continue
        documented = re.search(r"#[^#\n]*?\bexit\s+(\d[^#]*)$", joined, flags=re.M)
        codes = [int(n) for n in re.findall(r"\b\d+\b", documented.group(1))] if documented else [0]
        commands.append((joined, codes))
        current = []
    assert not current, f"unfinished command: {current}"
    return commands


def run_block(script: str, folder: Path, env: dict[str, str], timeout: int = 300) -> tuple[list[int], str]:
    """Run `script` in `folder` as one bash script; each command's exit status and the output."""
    commands = logical_commands(script)
    status = folder / ".doc-status"
    lines = [f'{command}\necho $? >> "{status}"' for command, _ in commands]
    result = subprocess.run(["bash", "-o", "pipefail", "-c", "\n".join(lines)], cwd=folder, env=env,
                            capture_output=True, text=True, timeout=timeout)
    codes = [int(n) for n in status.read_text().split()] if status.exists() else []
    return codes, result.stdout + result.stderr


def expected_codes(script: str) -> list[list[int]]:
    return [codes for _, codes in logical_commands(script)]
