"""The token tables for check_dump(only=..., maxima_only=True): pairs of a kind whose checks read of token_steps
only the token count and max |Δ| (on_policy: sql/check/on_policy.sql reads `tokens` and `max_abs`) are reduced
to those by kernels.reduce_maxima (rlprobe/checks/kernels.pyx), one branch-free pass, instead of every figure of token_figures.py
(histograms, position and probability buckets, per-sequence sums: ~12 ns a token of CPU, this pass ~1.5 ns with
the mapping of the files). Their token_steps rows hold tokens, nonfinite and max_abs, equal to the full reduction's,
with the other figures null, and they have no rows in the other token tables. Compare's single-run rules
(rlprobe/comparison/single_run.py) ask for it; `rlprobe check` reduces every figure (its reports show them)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from rlprobe.checks.compiled import kernel_arrays
from rlprobe.checks.kernels import reduce_maxima as maxima_kernel
from rlprobe.checks.token_rows import BUCKETS, HIST, SEQUENCES, STEPS, PairSelection, Part, loader
from rlprobe.checks.token_tables import pairs, tensor_rows, token_tables
from rlprobe.lake.reader import Dump

__all__ = ["MAXIMA_KINDS", "lean_token_tables", "maxima_steps", "reduce_maxima"]

#: pair kinds whose checks read only token_steps' tokens and max_abs (a check reading more adds none here)
MAXIMA_KINDS = frozenset({"on_policy"})
EMPTY = {"token_steps": STEPS, "token_hist": HIST, "token_positions": BUCKETS, "token_probability": BUCKETS,
         "token_sequences": SEQUENCES}


def reduce_maxima(a: np.ndarray, b: np.ndarray, mask: np.ndarray | None = None) -> tuple[int, float, int]:
    """(counted tokens, max |Δ| over them, masked tokens whose Δ is not finite) of one pair of equal shapes,
    as compiled.reduce_pair counts them (Δ = b − a in float64; a token counts where its mask is nonzero
    and Δ finite)."""
    a2, b2, m2 = kernel_arrays(a, b, mask)
    out = np.zeros(3, np.int64)
    maxima_kernel(a2.reshape(-1), b2.reshape(-1), m2.reshape(-1), out)
    return int(out[0]), float(out[1:2].view(np.float64)[0]), int(out[2])


def maxima_steps(dump: Dump, parts: list[Part], eps: float) -> pa.Table:
    """token_steps rows (STEPS) of these parts, one per (pair, step, rank), with tokens, nonfinite and max_abs."""
    keys: dict[tuple[str, int, int], dict] = {}
    for p in parts:
        load = loader(dump)  # a part's maps only: they are unmapped once it is reduced (the pairs may be large)
        mask = None if p.mask is None else load(p.mask, p.mask_rows)
        tokens, largest, bad = reduce_maxima(load(p.a, p.a_rows), load(p.b, p.b_rows), mask)
        key = (p.pair, p.a["step"], p.a["rank"])
        row = keys.get(key)
        if row is None:
            row = keys[key] = {"pair": p.pair, "step": key[1], "rank": key[2], "dtype_a": p.a["dtype"],
                               "dtype_b": p.b["dtype"], "masked": False, "tokens": 0, "nonfinite": 0,
                               "max_abs": 0.0, "eps": eps}
        row["masked"] = row["masked"] or p.mask is not None
        row["tokens"] += tokens
        row["nonfinite"] += bad
        row["max_abs"] = max(row["max_abs"], largest)
    for row in keys.values():
        if not row["tokens"]:
            row["max_abs"] = None
    return pa.Table.from_pylist([keys[k] for k in sorted(keys)], schema=STEPS)


def lean_token_tables(dump: Dump, stats: pa.Table, eps: float, workers: int, samples: pa.Table,
                      selection: PairSelection) -> dict[str, pa.Table]:
    """token_tables.token_tables of `selection`'s pairs, those of MAXIMA_KINDS reduced by maxima_steps only."""
    lean = selection.kinds & MAXIMA_KINDS
    rest = selection._replace(kinds=selection.kinds - lean)
    tables = token_tables(dump, stats, eps, workers, samples, rest) if rest.kinds else \
        {name: schema.empty_table() for name, schema in EMPTY.items()}
    if lean:
        maxima = maxima_steps(dump, pairs(tensor_rows(stats), samples, selection._replace(kinds=lean)), eps)
        tables["token_steps"] = pa.concat_tables([tables["token_steps"], maxima])
    return tables
