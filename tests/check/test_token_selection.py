"""check_dump(only=...) reduces only the token pairs the requested checks read (rlprobe/checks/token_rows.py):
on_policy's pairs at the (step, rank) its query judges, the rollout pairs for rollout_vs_recompute, none for
a check without token figures; its results stay those of the full check."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pytest
from tests.lake.layouts import rewrite_record

import rlprobe
from rlprobe.checks import check_dump
from rlprobe.checks.inputs import run_info, run_info_table, stats_table
from rlprobe.checks.token_rows import STEPS, on_policy_judged
from rlprobe.lake.sql_runner import run

RULES = ("on_policy", "rollout_vs_recompute")


def _rlprobe_run(path: Path, generation_config: bool) -> Path:
    """2 ranks x 6 steps x 2 micro-batches; per call, by (step + rank + micro) % 4: log_prob equal to
    old_log_prob (bitwise, same hash), off by 1e-3, of another shape, or saved without old_log_prob;
    rank 1 saves a later epoch at step 4; with `generation_config`, a generation serves 2 steps."""
    rng = np.random.default_rng(1)
    for rank in range(2):  # rank 0 first: it writes the run manifest
        with rlprobe.Probe(path, rank=rank, world_size=2, run_id="selection", flush_interval=0) as probe:
            if generation_config and rank == 0:
                probe.save_config({"trainer": {"steps_per_generation": 4, "gradient_accumulation_steps": 2}})
            for step in range(6):
                for micro in range(2):
                    old = -rng.random((3, 5), dtype=np.float32) * 2
                    kind = (step + rank + micro) % 4
                    data = {"log_prob": old if kind == 0 else old + np.float32(1e-3),
                            "old_log_prob": old if kind != 2 else old[:, :4]}
                    if kind == 3:
                        del data["old_log_prob"]
                    if step == 4:
                        data["ppo_epoch"] = np.int64(rank)
                    probe.save(data)
                probe.step()
    return path


def _msprobe_run(path: Path) -> Path:
    """msprobe's layout (no hashes): 5 steps x 2 micro-batches, log_prob off by 1e-3 at even steps."""
    rng = np.random.default_rng(2)
    for step in range(5):
        for micro in range(2):
            old = -rng.random((3, 5), dtype=np.float32)
            for key, value in (("old_log_prob", old), ("log_prob", old + np.float32(1e-3 * (step % 2 == 0)))):
                folder = path / "data" / key / f"step{step}" / "rank0" / f"micro_step{micro}"
                folder.mkdir(parents=True)
                np.save(folder / f"{key}.npy", value)
    return path


def _judged_by_the_query(path: Path, params: dict) -> set[tuple[int, int]]:
    """(step, rank) of every row sql/check/on_policy.sql may report, without token figures: at -1 ulps
    every pair it judges is beyond its tolerance."""
    dump = rlprobe.open(path)
    stats = stats_table(dump)
    info = run_info(dump, stats, dump.configs(), params)
    con = duckdb.connect()
    con.register("stats", stats)
    con.register("run_info", run_info_table(info))
    con.register("token_steps", STEPS.empty_table())
    rows = run(con, "check/on_policy.sql", on_policy_ulps=-1).to_pylist()
    return {(r["step"], r["rank"]) for r in rows}


def _selected(path: Path, params: dict) -> set[tuple[int, int]]:
    dump = rlprobe.open(path)
    stats = stats_table(dump)
    info = run_info(dump, stats, dump.configs(), params)
    return set(on_policy_judged(stats, info["first_step"], info["generation_every"]))


@pytest.mark.parametrize("params", [{}, {"generation_every": 3}])
@pytest.mark.parametrize("layout", ["rlprobe", "rlprobe-config", "msprobe"])
def test_the_on_policy_pairs_selected_are_those_the_query_judges(tmp_path, layout, params):
    path = (_msprobe_run(tmp_path / "run") if layout == "msprobe"
            else _rlprobe_run(tmp_path / "run", generation_config=layout == "rlprobe-config"))
    judged = _judged_by_the_query(path, params)
    assert _selected(path, params) == judged
    every = {(s, r) for s in range(6) for r in range(2)} if layout != "msprobe" else {(s, 0) for s in range(5)}
    if layout == "msprobe" and not params:  # every step generates, and no hash says a pair is equal
        assert judged == every
    else:
        assert judged and judged < every


def test_only_the_rules_read_their_pairs_and_report_what_the_full_check_does(tmp_path):
    path = _rlprobe_run(tmp_path / "run", generation_config=True)
    full, only = check_dump(path, {"on_policy_ulps": 0}), check_dump(path, {"on_policy_ulps": 0}, only=RULES)
    assert only.results.to_pylist() == [r for r in full.results.to_pylist() if r["check"] in RULES]
    assert only.rows["on_policy"].equals(full.rows["on_policy"]) and only.rows["on_policy"].num_rows > 0
    steps = only.tables["token_steps"].to_pylist()
    selected = _selected(path, {})
    assert {(r["step"], r["rank"]) for r in steps if r["pair"] == "on_policy"} == selected
    full_steps = {(r["pair"], r["step"], r["rank"]): r for r in full.tables["token_steps"].to_pylist()}
    assert len(full_steps) > len(steps)  # the full check reduces every pair (its reports show them)
    assert all(full_steps[(r["pair"], r["step"], r["rank"])] == r for r in steps)  # the same figures
    assert check_dump(path, only=("nonfinite",)).tables["token_steps"].num_rows == 0


def test_a_tensor_no_requested_rule_reads_is_never_opened(tmp_path):
    """log_prob of a step that does not generate (generation_every 2: odd steps) is unreadable (its record in
    the save call's packed file overwritten): the full check cannot read it, check_dump(only=RULES) never
    opens it and reports the same rows."""
    path = _rlprobe_run(tmp_path / "run", generation_config=True)
    before = check_dump(path, {"on_policy_ulps": 0}, only=RULES)
    dump = rlprobe.open(path)
    row = next(r for r in stats_table(dump).to_pylist()
               if r["canonical"] == "log_prob" and r["step"] == 3 and r["micro_step"] == 0 and r["rank"] == 0)
    rewrite_record(path, row, b"\0" * row["tensor_length"])
    after = check_dump(path, {"on_policy_ulps": 0}, only=RULES)
    assert after.rows["on_policy"].equals(before.rows["on_policy"])
    assert after.tables["token_steps"].equals(before.tables["token_steps"])
    with pytest.raises(rlprobe.errors.DumpReadError, match="log_prob"):
        check_dump(path)
