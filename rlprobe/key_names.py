"""The one table of trainers' key names (key_names.csv beside this file): which canonical key each
name is, read by capture (the keys whose rows identify samples), check (the `canonical` column of
its `stats`) and compare (the data-flow order, the verdict's rules and its single-run rules), so one
saved key is read one way everywhere (docs/compare.md, "Key names").

Columns: trainer, name, canonical, when_saved, sample_id, note. A name is mapped the same way by
every trainer that uses it. An ambiguous name has several rows: a row with `when_saved` applies only
to a run that saved that key too (in a comparison: either run), and the first row that applies
wins; the name's row without `when_saved`, last, is the default. OpenRLHF's `action_log_probs` is
the loss's current log-prob (log_prob) beside `old_action_log_probs`, else the Experience's
rollout-time log-prob (old_log_prob). `sample_id` "yes": the key's rows identify the samples of a
save call that has no sample_ids (lake/samples.py). Neutral: every layer may import it."""

from __future__ import annotations

import csv
import functools
from pathlib import Path
from typing import Iterable, Mapping

TABLE = Path(__file__).with_name("key_names.csv")
COLUMNS = ("trainer", "name", "canonical", "when_saved", "sample_id", "note")


@functools.lru_cache(maxsize=1)
def rows() -> tuple[dict[str, str], ...]:
    """key_names.csv's rows, in the file's order (each a dict of COLUMNS)."""
    with TABLE.open(encoding="utf-8", newline="") as f:
        return tuple({c: (row.get(c) or "").strip() for c in COLUMNS} for row in csv.DictReader(f))


def canonical_names(saved_keys: Iterable[str] = (), key_map: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every name of the table -> its canonical key, ambiguous names decided for a run (or a comparison's
    two runs) that saved `saved_keys`; then `key_map` (a user's --key-map or key_map:), which wins."""
    saved = set(saved_keys)
    table: dict[str, str] = {}
    for row in rows():
        if row["name"] not in table and (not row["when_saved"] or row["when_saved"] in saved):
            table[row["name"]] = row["canonical"]
    table.update(key_map or {})
    return table


def canonical(key: str, saved_keys: Iterable[str] = ()) -> str:
    """The canonical key of saved key `key` (the key itself when the table has no row for it)."""
    return canonical_names(saved_keys).get(key, key)


@functools.lru_cache(maxsize=1)
def sample_id_keys() -> tuple[str, ...]:
    """The keys whose rows identify the samples of a save call without sample_ids, in the table's order."""
    return tuple(dict.fromkeys(r["name"] for r in rows() if r["sample_id"] == "yes"))
