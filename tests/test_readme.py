"""The README's fresh-machine commands are the ones CI runs, and every shell block of the docs runs as
written (tests/doc_blocks.py says how a block is read). The demo block runs first, in a folder of its own;
its two runs are the dumps every other block is given."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.doc_blocks import DOC_FILES, REPO, SHELL, Block, doc_blocks, expected_codes, not_run_markers, run_block, \
    yaml_header_blocks


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


ALL_BLOCKS = [b for f in DOC_FILES for b in doc_blocks(f)]
TO_RUN = [b for b in ALL_BLOCKS if b.lang in SHELL and b.not_run is None] + yaml_header_blocks()
DEMO = next(b for b in TO_RUN if b.commands() == "rlprobe demo")
# the YAML sketch of docs/pipelines.md that the commands below it call nightly.yaml
SKETCH = next(b for b in ALL_BLOCKS if b.lang == "yaml" and "name: ppo-determinism" in b.text)


def _env() -> dict[str, str]:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # `python` is this one, rlprobe this tree
    return {**os.environ, "PYTHONPATH": str(REPO), "PATH": path}


@pytest.fixture(scope="module")
def demo_folder(tmp_path_factory):
    """README's demo block, run once per session (under xdist too: the workers share the folder, and a lock):
    the folder with rlprobe_demo/ in it, the commands' exit statuses and the output."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "readme_demo"
    folder.mkdir(exist_ok=True)
    with open(folder.with_suffix(".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = folder / ".doc-result.json"
        if not done.exists():
            codes, output = run_block(DEMO.commands(), folder, _env())
            done.write_text(json.dumps([codes, output]))
    codes, output = json.loads(done.read_text())
    return folder, codes, output


def _materials(demo: Path) -> dict[str, tuple[str, Path | str]]:
    """What a block may name, and how it is made in the block's folder: a link, a copy, or a file's text."""
    dumps = demo / "rlprobe_demo" / "dumps"
    return {
        "dumps/a": ("link", dumps / "baseline"), "dumps/b": ("link", dumps / "faulted"),
        "dumps/tonight": ("link", dumps / "baseline"),
        "A": ("link", dumps / "baseline"), "B": ("link", dumps / "faulted"),
        "dump": ("copy", dumps / "baseline"),  # compact writes into it
        "msprobe_dump": ("link", REPO / "tests/fixtures/msprobe/keydata/run_a"),
        "out/mon": ("link", demo / "rlprobe_demo" / "compare"), "out/tue": ("link", demo / "rlprobe_demo" / "compare"),
        "pipelines": ("copy", REPO / "pipelines"), "examples": ("link", REPO / "examples"),
        "nightly.yaml": ("text", SKETCH.text + "\n"),
    }


def _named(text: str) -> set[str]:
    tokens = {re.sub(r"^(\$PWD/|\./)", "", t) for t in re.findall(r"[\w./$-]+", text)}
    # a path names its first folder too: dumps/a/stats names dumps/a and dumps
    return {t for t in tokens if t} | {t.split("/", 1)[0] for t in tokens} | {"/".join(t.split("/")[:2]) for t in tokens}


def _prepare(block: Block, demo: Path, folder: Path) -> None:
    named = _named(block.commands())
    if "nightly.yaml" in named:  # and what the sketch names (its candidate)
        named |= _named(SKETCH.text)
    for name, (how, source) in _materials(demo).items():
        if name not in named:
            continue
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if how == "link":
            target.symlink_to(source, target_is_directory=True)
        elif how == "copy":
            shutil.copytree(source, target)
        else:
            target.write_text(source, encoding="utf-8")


def _same_words(line: str) -> str:
    return " ".join(line.split())


@pytest.mark.parametrize("block", TO_RUN, ids=lambda b: b.name)
def test_shell_block_runs_as_written(block, demo_folder, tmp_path):
    demo, codes, output = demo_folder
    if block is not DEMO:
        _prepare(block, demo, tmp_path)
        codes, output = run_block(block.commands(), tmp_path, _env())
    expected = expected_codes(block.commands())
    assert len(codes) == len(expected) and all(c in allowed for c, allowed in zip(codes, expected)), \
        f"{block.name}: exit statuses {codes}, documented {expected}\n{output[-4000:]}"
    said = _same_words(output)
    for line in block.output:  # a transcript's output, where it holds no elided part
        if line.strip() and "..." not in line:
            assert _same_words(line) in said, f"{block.name}: {line!r} not in the output:\n{output[-4000:]}"


def test_every_shell_block_runs_or_says_why_not():
    marked = {(b.file, b.line - 1) for b in ALL_BLOCKS if b.not_run is not None}
    for f in DOC_FILES:  # a marker stands right above a shell block, and gives its reason
        assert {(f, n) for n in not_run_markers(f)} <= marked, f"{f}: a not-run marker that is not above a block"
    for b in ALL_BLOCKS:
        if b.not_run is not None:
            assert b.lang in SHELL and len(b.not_run) > 10, f"{b.name}: a not-run marker needs a shell block, a reason"
        elif b.lang == "":  # an untagged block shows output or a tree, never commands to run
            first = b.text.lstrip().split("\n", 1)[0]
            assert not re.match(r"(\$ |rlprobe |python |pip |export |bash )", first), \
                f"{b.name}: commands in an untagged block: make it ```bash (or ```console, or ```text for a synopsis)"
    fresh = [b for b in ALL_BLOCKS if b.file == "README.md" and b.commands() in readme_commands()]
    assert len(fresh) == 2 and all("installs" in b.not_run for b in fresh)
    assert DEMO in TO_RUN and len(TO_RUN) >= 12
