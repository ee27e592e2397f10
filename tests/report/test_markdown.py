"""summary.md: verdict, suspect, advice, tables, escaping, size limits."""

from __future__ import annotations

import pytest

from rlprobe.errors import ProbeError
from rlprobe.report.markdown import MAX_DIVERGING_ROWS, render_summary_md, write_summary_md

from .conftest import key_row, make_key_data, make_summary


def _table_after(text: str, heading: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(heading) + 2
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def test_divergence_summary(tmp_path, diverging):
    key_data, summary = diverging
    path = write_summary_md(tmp_path / "summary.md", summary, key_data)
    text = path.read_text(encoding="utf-8")
    assert text.splitlines()[0] == ("## rlprobe: ❌ first divergence: 'log_prob', step 1, rank 0, micro_step 1 — "
                                    "mismatch (max abs err 4.17235, max rel err 1.24536)")
    assert "Run A: `/runs/gpu`" in text and "Run B: `/runs/npu`" in text
    assert "**Suspect:** the actor's forward during the update" in text
    assert "**Advice:** dump the actor's modules during the update for this step" in text
    assert "```yaml\nrlprobe_config:\n  actor_train_dump: true\n  step_start: 1\n  step_end: 1\n```" in text
    assert _table_after(text, "### Rows per status") == [
        "| status | rows |", "|---|---|", "| match | 7 |", "| mismatch | 1 |", "| shape_mismatch | 1 |",
        "| only_in_a | 1 |", "| only_in_b | 1 |"]
    assert _table_after(text, "### Per key") == [
        "| key | rows | match | mismatch | other | first divergent step | max abs err | max rel err |",
        "|---|---|---|---|---|---|---|---|",
        "| responses | 4 | 4 | 0 | 0 |  | 0 | 0 |",
        "| log_prob | 5 | 3 | 1 | 1 | 1 | 4.17235 | 1.24536 |",
        "| kl_loss | 2 | 0 | 0 | 2 | 0 | 0 | 0 |"]
    assert _table_after(text, "### Steps with divergence")[2:] == [
        "| 0 | 5 | kl_loss |", "| 1 | 6 | log_prob, kl_loss |"]
    rows = _table_after(text, "### Non-matching rows")
    assert rows[0] == ("| key | step | rank | micro_step | index | status | shape A | shape B | same % | max abs err "
                       "| max rel err | message |")
    assert len(rows) == 2 + 4
    assert rows[2] == "| kl_loss | 0 | 0 | 0 |  | only_in_a | [4, 16] |  |  |  |  |  |"
    assert rows[3] == ("| log_prob | 1 | 0 | 1 |  | mismatch | [4, 16] | [4, 16] | 93.75 | 4.17235 | 1.24536 "
                       "| max \\| rel err high |")
    assert text.endswith("<sub>compared in 1.25 s</sub>\n")


def test_no_divergence(tmp_path, agreeing):
    key_data, summary = agreeing
    text = write_summary_md(tmp_path / "s.md", summary, key_data).read_text(encoding="utf-8")
    assert text.splitlines()[0] == "## rlprobe: ✅ no divergence: every compared value matches"
    assert "Suspect" not in text and "Non-matching rows" not in text and "Steps with divergence" not in text
    assert "| match | 4 |" in text


def test_cells_are_escaped(tmp_path):
    rows = [key_row("a|b", 0, "mismatch", first=True, message="line1\nline2 <script> | x", index="k|1")]
    key_data = make_key_data(rows)
    summary = make_summary(key_data, {"key": "a|b", "step": 0, "rank": 0, "micro_step": 0, "index": "k|1",
                                      "status": "mismatch"})
    summary["advice"] = "use a | b -> c"
    text = render_summary_md(summary, key_data)
    assert text.splitlines()[0] == "## rlprobe: ❌ first divergence: 'a\\|b', step 0, rank 0, micro_step 0, index 'k\\|1' — mismatch"
    assert "**Advice:** use a \\| b -> c" in text
    assert "| a\\|b | 0 | 0 | 0 | k\\|1 | mismatch |" in text
    assert "line1<br>line2 &lt;script> \\| x" in text
    for line in text.splitlines():
        if line.startswith("| a"):  # every data row has as many cells as its header
            assert line.replace("\\|", "").count("|") in (9, 13)


def test_only_the_first_rows_are_listed(tmp_path):
    rows = [key_row("k", s, "mismatch", first=s == 0) for s in range(30)] + [key_row("k", 30)]
    key_data = make_key_data(rows)
    text = render_summary_md(make_summary(key_data, None), key_data)
    listed = _table_after(text, f"### First {MAX_DIVERGING_ROWS} of 30 non-matching rows")
    assert len(listed) == 2 + MAX_DIVERGING_ROWS
    assert listed[2].startswith("| k | 0 |") and listed[-1].startswith("| k | 19 |")


def test_many_diverging_steps_are_capped():
    key_data = make_key_data([key_row("k", s, "mismatch") for s in range(120)])
    text = render_summary_md(make_summary(key_data, None), key_data)
    assert len(_table_after(text, "### Steps with divergence")) == 2 + 50
    assert "… and 70 more steps with divergence" in text


def test_gates_and_read_errors(diverging):
    key_data, summary = diverging
    summary["gates"] = [{"name": "responses_identical", "passed": False, "rows": 3}]
    summary["read_errors"] = ["run A: part-0.parquet is corrupt"]
    text = render_summary_md(summary, key_data)
    assert _table_after(text, "### Gates") == ["| name | passed | rows |", "|---|---|---|",
                                               "| responses_identical | false | 3 |"]
    assert "- run A: part-0.parquet is corrupt" in text


def test_unwritable_path(tmp_path, diverging):
    key_data, summary = diverging
    with pytest.raises(ProbeError, match="is a directory"):
        write_summary_md(tmp_path, summary, key_data)


def test_next_config_yaml_reads_back():
    yaml = pytest.importorskip("yaml")
    from rlprobe.report.comparison_words import yaml_lines

    config = {"rlprobe_config": {
        "msprobe": True, "dump_path": "./dump b", "key_data_dump": ["responses", "log_prob"], "step_start": 1,
        "tag": None, "ratio": 1.5e-7, "word": "on", "number_text": "1", "date_text": "2024-01-02", "colon": "a: b",
        "hash": "#x", "name": "中文", "stages": [{"stage": "actor_update", "steps": [1, 2]}, "ref"], "empty": {},
        "inf": float("inf"), "neg": -3}}
    text = "\n".join(yaml_lines(config))
    assert "  key_data_dump: [responses, log_prob]" in text.splitlines()
    assert yaml.safe_load(text) == config
