"""The config diff: which saved config paths differ between two runs, which family of settings
each belongs to, and which of them explain the first divergence (docs/compare.md, "Config diff").

The ignore list and the families are data (config_families.yaml beside this file); the diff is
sql/config_diff.sql. Nothing here renders: rlprobe/report/markdown.py does."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pyarrow as pa

from rlprobe.lake.configs import value_text
from rlprobe.lake.reader import Dump
from rlprobe.lake.sql_runner import run

FAMILIES_FILE = Path(__file__).with_name("config_families.yaml")
CONFIG_SCHEMA = pa.schema([("rank", pa.int64()), ("path", pa.string()), ("value", pa.string())])
DIFF_SCHEMA = pa.schema([("path", pa.string()), ("value_a", pa.string()), ("value_b", pa.string()),
                         ("ranks", pa.list_(pa.int64())), ("ignored", pa.bool_()), ("family", pa.string()),
                         ("label", pa.string())])


@functools.lru_cache(maxsize=1)
def families() -> dict[str, Any]:
    """config_families.yaml: {"ignore": [glob, ...], "families": [{family, label, patterns, ...}, ...]}."""
    import yaml

    # libyaml's loader where PyYAML has it: the pure-Python one took 47 ms of every comparison
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(FAMILIES_FILE.read_text(encoding="utf-8"), Loader=loader)  # noqa: S506 - a safe loader


def default_ignore() -> list[str]:
    return list(families()["ignore"])


def patterns_table(ignore: list[str] | None = None, ignore_defaults: bool = True) -> pa.Table:
    """(kind, family, label, pattern, position): the ignore globs (defaults unless switched off,
    then `ignore`) and every family's patterns in the file's order."""
    rows = [("ignore", None, None, p) for p in (default_ignore() if ignore_defaults else []) + list(ignore or [])]
    for fam in families()["families"]:
        rows += [("family", fam["family"], fam["label"], str(p)) for p in fam["patterns"]]
    columns = list(zip(*rows)) if rows else [[], [], [], []]
    return pa.table({"kind": pa.array(columns[0], pa.string()), "family": pa.array(columns[1], pa.string()),
                     "label": pa.array(columns[2], pa.string()), "pattern": pa.array(columns[3], pa.string()),
                     "position": pa.array(range(len(rows)), pa.int64())})


def diff_configs(dump_a: Dump, dump_b: Dump, *, ignore: list[str] | None = None, ignore_defaults: bool = True,
                 read_errors: list[str] | None = None) -> pa.Table:
    """Every changed config path (DIFF_SCHEMA), ignored ones included and marked. A config file
    that cannot be read is a message in `read_errors` (its run then has no config)."""
    configs = {name: _configs(dump, side, read_errors)
               for name, dump, side in (("configs_a", dump_a, "A"), ("configs_b", dump_b, "B"))}
    if not any(t.num_rows for t in configs.values()):  # no config in either run (msprobe, plain dumps): no diff
        return DIFF_SCHEMA.empty_table()  # without a query, nor the families (~0.1 s of a small comparison)
    import duckdb

    con = duckdb.connect()
    for name, table in configs.items():
        con.register(name, table)
    con.register("config_patterns", patterns_table(ignore, ignore_defaults))
    return run(con, "config_diff.sql").cast(DIFF_SCHEMA)


def saved_configs(dump_a: Dump, dump_b: Dump) -> tuple[bool, bool]:
    """Whether each run saved a config (save_config)."""
    return bool(list(dump_a.path.glob("configurations*.json"))), bool(list(dump_b.path.glob("configurations*.json")))


def consistent(family: dict[str, Any], canonical_key: str | None, step: int | None) -> bool:
    """Whether a changed setting of `family` can explain a first divergence of `canonical_key` at
    `step` (None: no key data diverged, only modules or gradients)."""
    if family.get("any_key"):
        return True
    if canonical_key in family.get("keys", ()):
        return True
    return bool(family.get("after_update")) and (step is None or step > 0)


def causes(diff: pa.Table, first: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The changed, not ignored paths whose family explains `first` ({canonical_key, step}; None
    for a divergence seen only in modules or gradients), most specific family first: one that
    names the key, then one that acts through the update, then one that changes everything."""
    by_name = {f["family"]: f for f in families()["families"]}
    canonical_key = None if first is None else first.get("canonical_key")
    step = None if first is None else first.get("step")
    found = []
    for row in changed(diff):
        fam = by_name.get(row["family"] or "")
        if fam is None or not consistent(fam, canonical_key, step):
            continue
        rank = 0 if canonical_key in fam.get("keys", ()) else 1 if fam.get("after_update") else 2
        found.append((rank, row))
    return [row for _, row in sorted(found, key=lambda r: r[0])]


def changed(diff: pa.Table) -> list[dict[str, Any]]:
    """The rows of `diff` not on the ignore list."""
    return [r for r in diff.to_pylist() if not r["ignored"]]


def matches(path: str, pattern: str) -> bool:
    """config_families.yaml's glob rule (as sql/config_diff.sql applies it): a pattern with no dot
    matches the path's last part, one with a dot the path's end; both case-insensitively."""
    import fnmatch

    path, pattern = path.lower(), pattern.lower()
    if "." in pattern:
        return fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(path, "*." + pattern)
    return fnmatch.fnmatchcase(path.rsplit(".", 1)[-1], pattern)


def reward_source(dump_a: Dump, dump_b: Dump) -> str | None:
    """What the runs score their responses with: "model" where either run has a reward model (a
    reward_compute module dump, or a config path of config_families.yaml's reward_scoring.model not
    switched off), "function" where both runs' saved configs name reward functions and no reward model,
    None where a run saved no config that tells (the verdict then names both)."""
    found = [_reward_source(dump) for dump in (dump_a, dump_b)]
    if "model" in found:
        return "model"
    return "function" if found == ["function", "function"] else None


def _reward_source(dump: Dump) -> str | None:
    from rlprobe.comparison.options import has_module_stats

    if has_module_stats(dump):
        import pyarrow.compute as pc

        if pc.any(pc.equal(dump.arrow("module")["stage"], "reward_compute")).as_py():
            return "model"
    rules = families()["reward_scoring"]
    rows = dump.configs_table().to_pylist()
    off = any(matches(r["path"], p) and r["value"] in ("false", "null") for r in rows for p in rules["switch"])
    if not off and any(matches(r["path"], p) for r in rows for p in rules["model"]):
        return "model"
    if any(matches(r["path"], p) for r in rows for p in rules["function"]):
        return "function"
    return None


def _configs(dump: Dump, side: str, read_errors: list[str] | None) -> pa.Table:
    errors: list[str] = []
    table = dump.configs_table(errors)
    if read_errors is not None:
        read_errors.extend(f"run {side}: {e}" for e in errors)
    return table.select(CONFIG_SCHEMA.names).cast(CONFIG_SCHEMA) if table.num_rows else CONFIG_SCHEMA.empty_table()


def explain_config(summary: dict[str, Any], diff: pa.Table, canonical_key: str | None = None,
                   saved: tuple[bool, bool] = (True, True), key_warning: str | None = None) -> None:
    """Add the config diff to `summary` in place: config_diff (changed paths less the ignored),
    config_ignored (how many were left out), config_cause (the changed settings whose family
    explains the first divergence; the suspect then starts with them) and warnings."""
    rows = changed(diff)
    summary["config_diff"] = [{k: r[k] for k in ("path", "value_a", "value_b", "family", "ranks")} for r in rows]
    summary["config_ignored"] = diff.num_rows - len(rows)
    warnings = summary.setdefault("warnings", [])
    missing = [side for side, has in zip("AB", saved) if not has]
    if len(missing) == 1:  # neither run saving one (a plain or msprobe dump) is common, and no news
        warnings.append(f"run {missing[0]} saved no config (save_config / configurations_dump): "
                        "the config diff cannot name a changed setting")
    if key_warning:
        warnings.append(key_warning)
    first = summary.get("first_divergence")
    diverged = first is not None or summary.get("module_first_divergence") or summary.get("grad_first_flagged")
    if not diverged or not rows:
        summary["config_cause"] = []
        return
    amplification = summary.get("amplification") or {}
    if amplification.get("leads"):  # the suspect is the amplification point's key, not the marginal first divergence
        canonical_key, first = amplification["canonical_key"], amplification
    found = causes(diff, None if first is None else {"canonical_key": canonical_key,
                                                     "step": first.get("step")})
    summary["config_cause"] = [{k: r[k] for k in ("path", "value_a", "value_b", "family", "label")} for r in found]
    if not found:
        return
    shown = "; ".join(f"{r['label']} changed: {r['path']}: A={value_text(r['value_a'])}, B={value_text(r['value_b'])}"
                      for r in found[:3])
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    summary["suspect"] = f"config: {shown}{more} -> {summary.get('suspect')}"
    paths = ", ".join(r["path"] for r in found[:3])
    summary["advice"] = (f"the configs differ in a setting that explains this divergence ({paths}): set it alike in "
                         f"both runs, or confirm the change is meant, and compare again; else: {summary.get('advice')}")
