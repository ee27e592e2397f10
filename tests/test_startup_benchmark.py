"""benchmarks/startup.py runs: one rep, this checkout only, with pandas and hidden."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_startup_benchmark_measures_with_and_without_pandas(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import startup

    out = tmp_path / "r.json"
    assert startup.main(["--repeat", "1", "--formats", "msprobe", "--tmp", str(tmp_path), "--json", str(out)]) == 0
    summary = json.loads(out.read_text())["summary"]
    assert set(summary["medians"]) == {"msprobe, with pandas, this", "msprobe, without pandas, this"}
    assert all(m["wall"] > 0 and m["cpu"] > 0 for m in summary["medians"].values())
    assert summary["target_wall_s"] == 1.0 and set(summary["target_met"]) == {"msprobe, with pandas",
                                                                               "msprobe, without pandas"}
    assert '"paired_ratio_baseline_over_this": {}' in capsys.readouterr().out
    (tmp_path / "d").mkdir()
    a, b = startup.make_tiny_dumps(tmp_path / "d", "msprobe")
    assert b.name == "tiny_msprobe_b" and (a / "data/x/step0/rank0/micro_step0/x.npy").is_file()
    sys.modules.pop("startup", None)
