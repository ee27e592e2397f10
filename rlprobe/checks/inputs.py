"""The tables the check queries read, built from one dump through rlprobe.lake: `stats` (key-data
statistics with each key's canonical name), `scalars`, `configs`, `run_info` (what the run's config
and saved keys say about it: first step, ε, generation interval, group size, reference start)
and `grad_steps` (per monitor and step: total gradient norm and sign agreement with the previous step)."""

from __future__ import annotations

import json
from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rlprobe.key_names import canonical_names
from rlprobe.lake.configs import config_leaves
from rlprobe.lake.reader import Dump
from rlprobe.lake.regular_files import SIGNS, load_npy

# config leaves (the last path component) that the checks read; docs/check.md lists them
CLIP_CONFIG = ("clip_ratio", "cliprange", "clip_range", "clip_eps", "epsilon", "clip")
GROUP_SIZE_CONFIG = ("num_generations", "group_size", "n_samples_per_prompt")
REF_FROM_ACTOR_CONFIG = ("ref_starts_as_actor",)

STATS_COLUMNS = ("key", "step", "rank", "micro_step", "index", "dtype", "shape", "numel", "min", "max", "mean",
                 "norm", "nan_count", "inf_count", "hash", "tensor_file", "tensor_offset", "tensor_length", "absent")
GRAD_STEPS = pa.schema([("monitor", pa.string()), ("step", pa.int64()), ("rank", pa.int64()),
                        ("params", pa.int64()), ("norm", pa.float64()), ("nonfinite_params", pa.int64()),
                        ("sign_agreement", pa.float64())])


def stats_table(dump: Dump, names: Mapping[str, str] | None = None,
                key_map: Mapping[str, str] | None = None) -> pa.Table:
    """The dump's key-data statistics with each key's canonical name: from `names` (saved key ->
    canonical, decided by a comparison for both its runs) where given, else from rlprobe/key_names.csv
    decided by the keys this dump saved, and a user's `key_map` over it."""
    table = dump.arrow("key_data")
    columns = {}
    for name in STATS_COLUMNS:
        if name in table.column_names:
            columns[name] = table[name]
        else:  # msprobe dumps have no dtype or counts
            columns[name] = pa.nulls(table.num_rows, pa.string() if name in ("dtype", "hash", "tensor_file")
                                     else pa.bool_() if name == "absent" else pa.int64())
    saved = pc.unique(columns["key"])  # map each distinct key once, not each row
    keys = saved.to_pylist()
    table_names = canonical_names(keys, key_map) if names is None else names
    canonical = pa.array([table_names.get(k, k) for k in keys], pa.string())
    columns["canonical"] = pc.take(canonical, pc.index_in(columns["key"], saved))
    return pa.table(columns)


def key_canonical(stats: pa.Table) -> dict[str, str]:
    """saved key -> its canonical name, as `stats` (stats_table) reads it."""
    pairs = stats.select(["key", "canonical"]).group_by(["key", "canonical"]).aggregate([])
    return dict(zip(pairs["key"].to_pylist(), pairs["canonical"].to_pylist()))


def config_leaf(configs: dict[int, dict[str, Any]], names: tuple[str, ...]) -> tuple[str, Any] | None:
    """(path, value) of the first leaf of rank 0's config (else any rank's) whose last path
    component is one of `names`, in the order of `names`."""
    for cfg in sorted(configs.items()):
        leaves = dict(config_leaves(cfg[1]))
        for name in names:
            for path, value in leaves.items():
                if path.split(".")[-1] == name and value is not None:
                    return path, value
    return None


def run_info(dump: Dump, stats: pa.Table, configs: dict[int, dict[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
    """What the checks need to know about the run, each with where it came from."""
    info: dict[str, Any] = {"first_step": pc.min(stats["step"]).as_py() if stats.num_rows else None}
    eps = params.get("eps")
    source = "parameter eps"
    if eps is None:
        found = config_leaf(configs, CLIP_CONFIG)
        if found and _number(found[1]) is not None and 0 < float(found[1]) < 1:
            eps, source = float(found[1]), f"config {found[0]}"
        else:
            eps, source = 0.2, "default"
    info.update(eps=float(eps), eps_source=source)
    every = params.get("generation_every")
    if every is None:  # TRL: a generation serves steps_per_generation * num_iterations micro-batches
        spg = config_leaf(configs, ("steps_per_generation",))
        ga = config_leaf(configs, ("gradient_accumulation_steps",))
        iters = config_leaf(configs, ("num_iterations",))
        ga_n = int(_number(ga[1]) or 1) if ga else 1
        spg_n = int(_number(spg[1]) or ga_n) if spg else ga_n
        it_n = int(_number(iters[1]) or 1) if iters else 1
        every = max(1, round(spg_n * it_n / max(ga_n, 1)))
        info["generation_every_source"] = "config" if (spg or iters) else "default (every step generates)"
    else:
        info["generation_every_source"] = "parameter generation_every"
    info["generation_every"] = int(every)
    group = params.get("group_size")
    found = None if group is not None else config_leaf(configs, GROUP_SIZE_CONFIG)
    size = _number(found[1]) if found else None
    if size is not None and size >= 1 and size.is_integer():  # a config's 0, -4 or 2.5 is no group size
        group = int(size)
    info["group_size"] = int(group) if group else None
    info["group_source"] = ("parameter group_size" if params.get("group_size") else
                            f"config {found[0]}" if found and group else None)
    declared = params.get("ref_starts_as_actor")
    found = None if declared is not None else config_leaf(configs, REF_FROM_ACTOR_CONFIG)
    if found is not None and isinstance(found[1], bool):
        declared = found[1]
    info["ref_starts_as_actor"] = declared if isinstance(declared, bool) else None
    info["has_tensors"] = bool(stats.num_rows) and pc.any(pc.is_valid(stats["tensor_file"])).as_py() is True
    return info


def run_info_table(info: dict[str, Any]) -> pa.Table:
    return pa.table({"first_step": pa.array([info["first_step"]], pa.int64()),
                     "eps": pa.array([info["eps"]], pa.float64()),
                     "generation_every": pa.array([info["generation_every"]], pa.int64()),
                     "group_size": pa.array([info["group_size"]], pa.int64()),
                     "ref_starts_as_actor": pa.array([info["ref_starts_as_actor"]], pa.bool_())})


def grad_steps(dump: Dump) -> pa.Table:
    """Per gradient monitor, step and rank: the total norm over parameters, how many parameters
    have a non-finite norm, and the share of gradient elements whose sign equals the previous
    step's (weighted by numel; null without sign maps or a previous step)."""
    grad = dump.arrow("grad")
    if grad.num_rows == 0:
        return GRAD_STEPS.empty_table()
    wanted = [c for c in ("monitor", "step", "rank", "param", "numel", "norm", "sign_file", "sign_offset",
                          "sign_numel") if c in grad.column_names]
    rows = grad.select(wanted).to_pylist()
    by_step: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for row in rows:
        by_step.setdefault((row["monitor"], row["rank"], row["step"]), []).append(row)
    out: dict[str, list[Any]] = {name: [] for name in GRAD_STEPS.names}
    previous: dict[tuple[str, int], dict[str, np.ndarray]] = {}
    for (monitor, rank, step), params in sorted(by_step.items()):
        norms = np.array([np.nan if p["norm"] is None else p["norm"] for p in params], np.float64)
        signs = _signs(dump, params)
        before = previous.get((monitor, rank))
        agreement = None
        if before is not None and signs:
            equal = total = 0
            for name, bitsv in signs.items():
                old = before.get(name)
                if old is not None and old.size == bitsv.size:
                    equal += int(np.count_nonzero(old == bitsv))
                    total += bitsv.size
            agreement = equal / total if total else None
        previous[(monitor, rank)] = signs
        for name, value in (("monitor", monitor), ("step", step), ("rank", rank), ("params", len(params)),
                            ("norm", float(np.sqrt(np.sum(norms ** 2)))),
                            ("nonfinite_params", int(np.count_nonzero(~np.isfinite(norms)))),
                            ("sign_agreement", agreement)):
            out[name].append(value)
    return pa.table(out, schema=GRAD_STEPS)


def _signs(dump: Dump, params: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Each parameter's sign bits (unpacked, bool) of one step, from the step's sign file."""
    found: dict[str, np.ndarray] = {}
    files: dict[str, np.ndarray] = {}
    for p in params:
        file, numel = p.get("sign_file"), p.get("sign_numel")
        if not file or numel is None:
            continue
        if file not in files:
            try:
                files[file] = load_npy(dump.path / file, SIGNS, mmap=True)
            except (OSError, ValueError):
                continue
        data = files[file]
        offset = p.get("sign_offset")
        if offset is None:  # msprobe: a bool .npy of the parameter
            found[p["param"]] = np.asarray(data, bool).ravel()
        else:
            found[p["param"]] = np.unpackbits(np.asarray(data[offset:offset + (numel + 7) // 8]))[:numel].astype(bool)
    return found


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def configs_json(configs: dict[int, dict[str, Any]]) -> str:
    return json.dumps(configs, default=str)
