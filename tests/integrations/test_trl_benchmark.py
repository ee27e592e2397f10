"""benchmarks/trl_overhead.py runs end to end (its figures are measured, never asserted)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_trl_overhead_script_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import trl_overhead

    out = tmp_path / "r.json"
    assert trl_overhead.main(["--smoke", "--threads", "1", "--tmp", str(tmp_path), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    summary, runs = result["summary"], result["runs"]
    assert summary["level"] == "key_data" and summary["reps"] == 1 and summary["steps"] == 3
    assert len(runs) == 1 and runs[0]["plain"] > 0 and runs[0]["rlprobe"] > 0
    assert summary["overhead_pct"] == (runs[0]["rlprobe"] / runs[0]["plain"] - 1) * 100
    assert "with attach(trainer, cfg)" in capsys.readouterr().out
    assert set(summary["cpu_ms"]) == {"plain", "rlprobe"}
    assert summary["cpu_ms"]["rlprobe"]["train_cpu"] > 0
    sys.modules.pop("trl_overhead", None)
