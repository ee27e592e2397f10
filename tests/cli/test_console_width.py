"""Every command's console output keeps paths and numbers whole, whatever the width or the path's length.

Each command runs twice over: through click's runner (a pipe, with COLUMNS at 20, 80 and 300, which
must not wrap at all) and in a real pseudo-terminal of 40 and 20 columns (wrapped between words,
never inside a path, a number or a table cell). The folders sit under a name longer than any line.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import rlprobe
from rlprobe.cli import main

# longer than any terminal line, with spaces (a path may hold them) and no break inside it allowed
LONG = "a folder whose name alone is longer than a terminal line-" * 3


def _dump(path: Path, *, bump: float, tps: float) -> Path:
    with rlprobe.Probe(path, rank=0, world_size=1) as p:
        for step in range(3):
            p.save({"responses": np.arange(6), "log_prob": np.ones(8, np.float32) + (bump if step >= 1 else 0.0)})
            p.log_metrics({"e2e_tps": tps})
            p.step()
    return path


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> dict[str, Path]:
    """Two runs differing from step 1 by 0.125, a pipeline over them and a history of two pipeline runs."""
    root = tmp_path_factory.mktemp("width") / LONG
    a, b = _dump(root / "run a", bump=0.0, tps=100.0), _dump(root / "run b", bump=0.125, tps=90.0)
    spec = root / "width.yaml"
    spec.write_text(f"""version: 1
name: width
runs: {{base: {json.dumps(str(a))}, cand: {json.dumps(str(b))}}}
output: {json.dumps(str(root / "pipeline out"))}
history: {json.dumps(str(root / "history.parquet"))}
gates:
  - {{name: tps, sql: sql/gates/tps_regression.sql}}
""", encoding="utf-8")
    runner = CliRunner()
    for i, cand in enumerate((b, a)):
        result = runner.invoke(main, ["pipeline", "run", str(spec), "--set", f"runs.cand={cand}",
                                      "--set", f"output={root / f'history run {i}'}"], catch_exceptions=False)
        assert result.exit_code == 1 - i, result.output
    return {"root": root, "a": a, "b": b, "spec": spec, "history": root / "history.parquet"}


def _commands(lake: dict[str, Path], tag: str) -> list[tuple[list[str], list[str], list[str]]]:
    """(arguments, pieces each printed whole on one line, lines a pipe shows exactly) for every command.

    `tag` names this width's outputs, so no two tests write to the same folder.
    """
    root, a, b, spec, history = lake["root"], lake["a"], lake["b"], lake["spec"], lake["history"]
    out, pipeline_out, plots = root / f"compare {tag}", root / f"pipeline {tag}", root / f"plots {tag}"
    reports = f"{out}/report.xlsx, {out}/summary.md, {out}/key_data.parquet"
    own_output = ["--set", f"output={pipeline_out}", "--set", f"history={root / f'history {tag}.parquet'}"]
    return [
        (["info", str(a)], [str(a), "world_size 1", "log_prob", "responses", "0-2 (3)"], []),
        (["sql", str(b), f"SELECT key, max(max) AS top, '{b}' AS dump FROM key_data GROUP BY key ORDER BY key"],
         ["1.125", str(b), "log_prob"], []),
        (["compare", str(a), str(b), "-o", str(out), "--quiet"],
         [str(a), str(b), f"{out}/report.xlsx", f"{out}/summary.md", "max abs err 0.125", "max rel err 0.111",
          "step 1", "rank 0", "micro_step 0"],
         [f"report: {reports}"]),
        (["pipeline", "validate", str(spec)], [str(spec), f"base={a}", f"cand={b}"], []),
        (["pipeline", "run", str(spec), "--dry-run", *own_output], [str(spec), str(a), str(b), str(pipeline_out)],
         [f"  run A: base = {a}", f"  run B: cand = {b}"]),
        (["pipeline", "run", str(spec), *own_output], [str(pipeline_out), "step 1", "(1 rows)"],
         [f"report: {pipeline_out}", "gate tps: FAIL (1 rows)"]),
        (["history", str(history), "--plots", str(plots)], [str(history), "(2 runs)", str(plots), "1/1", "0/1"],
         [f"{history} (2 runs)"]),
    ]


def _lines_holding(text: str, piece: str) -> list[str]:
    return [line for line in text.splitlines() if piece in line]


@pytest.mark.parametrize("columns", [20, 80, 300])
def test_piped_output_is_never_wrapped_whatever_columns_says(lake, columns):
    runner = CliRunner()
    for args, pieces, exact_lines in _commands(lake, f"pipe {columns}"):
        result = runner.invoke(main, args, env={"COLUMNS": str(columns)}, catch_exceptions=False)
        assert result.exit_code in (0, 1), (args, result.output)
        for piece in pieces:
            assert _lines_holding(result.output, piece), (args[0], piece, result.output)
        for line in exact_lines:
            assert line in result.output.splitlines(), (args[0], line, result.output)


_RUN_ALL = """
import json, sys
from rlprobe.cli import main
for args in json.loads(sys.argv[1]):
    print("=== " + args[0], flush=True)
    code = main(args, standalone_mode=False)
    print(f"=== exit {code or 0}", flush=True)
"""
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


def _run_on_terminal(columns: int, argv: list[list[str]]) -> str:
    """What `argv`'s commands print to a real pseudo-terminal `columns` wide, without colour codes."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
    env.update(TERM="xterm-256color", PYTHONPATH=str(Path(rlprobe.__file__).resolve().parents[1]))
    proc = subprocess.Popen([sys.executable, "-c", _RUN_ALL, json.dumps(argv)], stdin=slave, stdout=slave,
                            stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 1 << 16)
        except OSError:  # EIO: every process holding the terminal has ended
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=60) == 0, b"".join(chunks)[-3000:]
    return _ESCAPES.sub("", b"".join(chunks).decode()).replace("\r\n", "\n")


@pytest.mark.parametrize("columns", [20, 40])
def test_a_terminal_wraps_between_words_never_inside_a_path_or_a_number(lake, columns):
    commands = _commands(lake, f"tty {columns}")
    text = _run_on_terminal(columns, [args for args, _, _ in commands])
    outputs = text.split("=== ")[1:]
    assert [o.split("\n")[0] for o in outputs[::2]] == [args[0] for args, _, _ in commands]
    assert all(o.startswith(("exit 0", "exit 1")) for o in outputs[1::2]), text
    for (args, pieces, _), output in zip(commands, outputs[::2]):
        for piece in pieces:
            assert _lines_holding(output, piece), (args[0], piece, output)
    # and the terminal's width was used: the verdict wrapped between its fields
    verdict = outputs[4]
    assert _lines_holding(verdict, "first divergence") and not _lines_holding(verdict, "micro_step 0: mismatch (max")


def test_a_table_written_to_a_file_is_never_wrapped(lake, tmp_path):
    target = tmp_path / "table.txt"
    query = f"SELECT key, max(max) AS top, '{lake['b']}' AS dump FROM key_data GROUP BY key ORDER BY key"
    result = CliRunner().invoke(main, ["sql", str(lake["b"]), query, "-o", str(target)], env={"COLUMNS": "20"},
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = [line for line in target.read_text(encoding="utf-8").splitlines() if str(lake["b"]) in line]
    assert len(rows) == 2 and "log_prob" in rows[0] and "1.125" in rows[0] and "responses" in rows[1]
