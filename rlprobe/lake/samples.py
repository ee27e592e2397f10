"""Sample identity of batch rows: the `sample` stats kind (docs/dump-format.md, "Samples").

A batch tensor's leading dimension is the sample. Each save() call that carries a sample
identity (its `sample_ids`, or else a prompt key such as "prompts") writes one `sample` row per
row of each batch tensor of the call: which sample it is, where it sits (rank, micro_step, row)
and cheap per-row statistics (a 64-bit hash of the row's bytes, sum, min, max), so runs with
different layouts (micro-batches, data-parallel ranks, shuffled micro-batches) are compared per
sample, statistics-only dumps included.

The training thread only checks the call (`call_identity`, no per-row work for derived ids);
the writer thread hashes rows vectorised (`sample_table`), with no Python loop over rows.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from rlprobe.errors import ProbeError
from rlprobe.key_names import sample_id_keys
from rlprobe.lake.encoding import widen
from rlprobe.lake.schema import SAMPLE
from rlprobe.lake.statistics import STACK_BYTES, stack_groups

_SEED = 0x9E3779B97F4A7C15  # fixed: hashes must agree across runs, processes and hosts


@functools.lru_cache(maxsize=1)
def _multipliers() -> np.ndarray:
    """4096 odd uint64 multipliers (no single-word collision), made on first use: importing numpy.random
    cost every command that reads a dump ~10 ms of start-up (issue 18)."""
    return np.random.Generator(np.random.PCG64(_SEED)).integers(
        0, 2**63, 4096, dtype=np.uint64) * np.uint64(2) + np.uint64(1)


@dataclass
class CallIdentity:
    """The sample identity of one save call (training thread's check, writer thread's input)."""

    rows: int  # batch size: the leading dimension of every batch tensor of the call
    prompt_leaf: int | None  # position (in the call's leaves) of the prompt tensor, for derived ids
    explicit: np.ndarray | None  # uint64 identity per row from sample_ids; None: derive from prompts
    explicit_text: list[str] | None  # the ids as given, stored beside the hash
    groups: list[str] | None
    # integer ids (a tensor or array of ints): checked on the training thread, hashed and written
    # out as text by the writer (`resolve`), which keeps that Python work off the training thread
    int_ids: np.ndarray | None = None
    int_groups: np.ndarray | None = None

    def resolve(self) -> "CallIdentity":
        """Fill `explicit`, `explicit_text` and `groups` from integer ids (writer side; idempotent)."""
        if self.int_ids is not None:
            self.explicit = row_hashes(self.int_ids.reshape(-1, 1))
            self.explicit_text = [str(v) for v in self.int_ids.tolist()]
            self.int_ids = None
        if self.int_groups is not None:
            self.groups = [str(v) for v in self.int_groups.tolist()]
            self.int_groups = None
        return self


def call_identity(keys: Sequence[tuple[str, str, tuple[int, ...] | None]], sample_ids: Any, group_ids: Any,
                  where: str) -> CallIdentity | None:
    """Check a save call's identity; `keys`: (key, index, shape or None when absent) per leaf.
    None when the call has neither sample_ids nor a prompt key (no sample rows then)."""
    int_ids = None
    # the keys whose rows identify the samples when no sample_ids are given: rlprobe/key_names.csv's sample_id
    prompt_keys = sample_id_keys()
    prompt = next((i for i, (key, index, shape) in enumerate(keys)
                   if key in prompt_keys and index == "" and shape is not None and len(shape) >= 1), None)
    batch = [(key, index, shape) for key, index, shape in keys if shape is not None and len(shape) >= 1]
    if sample_ids is None:
        if prompt is None:
            if group_ids is not None:
                raise ProbeError(f"{where}: save(group_ids=...) needs sample_ids=..., or a prompt key in the same "
                                 f"call ({', '.join(prompt_keys)}) whose rows identify the samples")
            return None
        rows = keys[prompt][2][0]  # type: ignore[index]
        explicit = text = None
    else:
        int_ids = _int_array(sample_ids)
        if int_ids is not None and _distinct(int_ids):
            rows, explicit, text = len(int_ids), None, None
        else:  # strings, a list, or a duplicate (refused below with the id it repeats)
            int_ids = None
            text = _as_id_list(sample_ids, "sample_ids", where)
            rows = len(text)
            explicit = _id_hashes(sample_ids, text)
            _refuse_duplicates(text, explicit, "sample_ids", where)
    if prompt is not None and keys[prompt][2][0] != rows:  # type: ignore[index]
        raise ProbeError(f"{where}: sample_ids has {rows} ids but key {keys[prompt][0]!r} has "
                         f"{keys[prompt][2][0]} rows (its leading dimension); give one id per row of "  # type: ignore
                         "the batch tensors")
    if not any(shape[0] == rows for _, _, shape in batch):
        found = ", ".join(f"{k!r}{f' index {i!r}' if i else ''}: {s[0]}" for k, i, s in batch) or "no tensor"
        raise ProbeError(f"{where}: sample_ids has {rows} ids but no tensor of this call has {rows} rows "
                         f"(leading dimensions: {found}); give one id per row of the batch tensors")
    groups = int_groups = None
    if group_ids is not None:
        int_groups = _int_array(group_ids)
        if int_groups is None:
            groups = _as_id_list(group_ids, "group_ids", where)
        count = len(groups if int_groups is None else int_groups)
        if count != rows:
            raise ProbeError(f"{where}: group_ids has {count} ids but the batch has {rows} rows "
                             "(the leading dimension of its tensors); give one group id per row")
    return CallIdentity(rows, prompt, explicit, text, groups, int_ids, int_groups)


def _distinct(ids: np.ndarray) -> bool:
    """Whether no id repeats. A batch's few ids through a Python set: np.unique sorts, and numpy's sort
    gives up the GIL, which beside a busy writer thread can take a switch interval to get back."""
    if len(ids) <= 1 << 16:
        return len(set(ids.tolist())) == len(ids)
    return len(np.unique(ids)) == len(ids)


def _int_array(ids: Any) -> np.ndarray | None:
    """A 1-D integer numpy array or torch tensor as an int64 copy (the caller may change its tensor
    afterwards); None for anything else (lists, strings, other frameworks: the general path)."""
    if isinstance(ids, np.ndarray):
        arr = ids
    elif type(ids).__module__.startswith("torch") and hasattr(ids, "numpy"):
        try:
            # torch calls give up the GIL (each can wait up to a switch interval beside a busy writer):
            # a host tensor autograd does not track (integer ids never are) needs only numpy()
            host = getattr(ids, "is_cpu", False) and not getattr(ids, "requires_grad", True)
            arr = ids.numpy() if host else ids.detach().cpu().numpy()
        except (RuntimeError, TypeError):
            return None
    else:
        return None
    if arr.ndim != 1 or arr.dtype.kind not in "iu" or (arr.dtype.kind == "u" and arr.dtype.itemsize == 8):
        return None
    return arr.astype(np.int64)


def _as_id_list(ids: Any, field: str, where: str) -> list[str]:
    if hasattr(ids, "tolist") and not isinstance(ids, (list, tuple)):  # a tensor or an array
        if len(getattr(ids, "shape", ())) != 1:
            raise ProbeError(f"{where}: {field} must be one-dimensional (one id per row), got shape "
                             f"{tuple(ids.shape)}")
        ids = ids.tolist()
    if not isinstance(ids, (list, tuple)):
        raise ProbeError(f"{where}: {field} must be a list, tuple, 1-D array or tensor of ints or strings, "
                         f"got {type(ids).__name__}")
    out = []
    for i, v in enumerate(ids):
        if isinstance(v, bool) or not isinstance(v, (int, str, np.integer)):
            raise ProbeError(f"{where}: {field}[{i}] is {type(v).__name__} {v!r}; expected an int or a string")
        out.append(str(v))
    return out


def _id_hashes(ids: Any, text: list[str]) -> np.ndarray:
    """uint64 per id: integer ids hashed vectorised, strings one by one (they came as Python objects)."""
    if text and all(t.lstrip("-").isdigit() for t in text):
        return row_hashes(np.asarray([int(t) for t in text], dtype=np.int64).reshape(-1, 1))
    return np.array([int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "little") for t in text],
                    dtype=np.uint64)


def _refuse_duplicates(text: list[str], hashes: np.ndarray, field: str, where: str) -> None:
    unique, first, counts = np.unique(hashes, return_index=True, return_counts=True)
    if len(unique) != len(hashes):
        dup = text[int(first[np.argmax(counts > 1)])]
        raise ProbeError(f"{where}: {field} holds {dup!r} more than once in this call; sample ids must be "
                         "unique within a call (a sample saved again in a later call of the step, such as "
                         "another epoch, is its next occurrence)")


# -- writer thread -------------------------------------------------------------------------
def row_hashes(raw: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each row's bytes (leading dimension = rows), vectorised: the row's
    little-endian 64-bit words times fixed odd multipliers, summed, then mixed (splitmix64)."""
    n = raw.shape[0]
    if n == 0:
        return np.zeros(0, np.uint64)
    b = np.ascontiguousarray(raw).reshape(n, -1).view(np.uint8).reshape(n, -1)
    width = b.shape[1]
    if width % 8:
        b = np.concatenate([b, np.zeros((n, 8 - width % 8), np.uint8)], axis=1)
    words = b.view("<u8")
    multipliers = _multipliers()
    k = multipliers[np.arange(words.shape[1]) % len(multipliers)]
    if words.shape[1] > len(multipliers):  # long rows: vary the multiplier per pass over the table
        k = k + (np.arange(words.shape[1], dtype=np.uint64) // np.uint64(len(multipliers))) * np.uint64(2)
    with np.errstate(over="ignore"):
        h = (words * k).sum(axis=1, dtype=np.uint64) ^ np.uint64(width)
        h ^= h >> np.uint64(30)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(27)
        h *= np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(31)
    return h


class OccurrenceCounter:
    """How many times each sample was saved earlier in the step, per (key, index): GRPO repeats a
    prompt once per generation, and a later epoch saves a sample again. Writer thread only."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.seen: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}

    def occurrences_of_calls(self, calls: Sequence[tuple[int, Sequence[tuple[str, str]], np.ndarray]]
                             ) -> list[np.ndarray]:
        """Occurrences of each call's rows (step, its (key, index) pairs, its uint64 ids), counted
        through the calls in their order (steps never decrease), one flat array per call (keys
        major). One sort for all the calls, where one per call cost ~15 numpy calls each: rows
        are ordered by (step, key, index, id), stably, with the counts kept from earlier calls of
        the step entered before them as weighted rows; a row's occurrence is the weight before it
        in its run."""
        if not calls:
            return []
        codes: dict[tuple[int, str, str], int] = {}
        group_parts, id_parts, sizes = [], [], []
        for step, keys, ids in calls:
            call_codes = [codes.setdefault((step, *key), len(codes)) for key in keys]
            group_parts.append(np.repeat(np.array(call_codes, np.int64), len(ids)))
            id_parts += [ids] * len(keys)  # concatenated once below: np.tile per call cost ~15 us
            sizes.append(len(keys) * len(ids))
        if calls[0][0] != self.step:
            self.step, self.seen = calls[0][0], {}
        history = [(codes[(self.step, *key)], seen) for key, seen in self.seen.items() if (self.step, *key) in codes]
        groups = np.concatenate([np.repeat(code, len(seen[0])) for code, seen in history] + group_parts)
        ids = np.concatenate([seen[0] for _, seen in history] + id_parts)  # uint64, as the history keeps them
        weights = np.concatenate([seen[1] for _, seen in history] + [np.ones(sum(sizes), np.int64)])
        order = np.lexsort((ids, groups))  # stable: earlier rows (and the history) first within a sample
        g, i, w = groups[order], ids[order], weights[order]
        starts = np.r_[True, (g[1:] != g[:-1]) | (i[1:] != i[:-1])]
        before = np.cumsum(w) - w  # weight of the rows before each, in sorted order
        occurrence = np.empty(len(order), np.int64)
        occurrence[order] = before - np.maximum.accumulate(np.where(starts, before, 0))
        last = calls[-1][0]
        if last != self.step:
            self.step, self.seen = last, {}
        run_at = np.flatnonzero(starts)
        run_g, run_ids = g[run_at], i[run_at]
        run_w = np.add.reduceat(w, run_at)
        for (step, key, index), code in codes.items():
            if step == last:
                lo, hi = np.searchsorted(run_g, [code, code + 1])
                self.seen[(key, index)] = (run_ids[lo:hi], run_w[lo:hi])
        bounds = np.cumsum([len(order) - sum(sizes), *sizes]).tolist()
        return [occurrence[a:b] for a, b in zip(bounds, bounds[1:])]


def sample_table(identity: CallIdentity, leaves: Sequence[Any], step: int, counter: OccurrenceCounter) -> pa.Table:
    """The `sample` rows of one save call. `leaves`: objects with key, index, micro_step and a
    staged `leaf` (dtype, shape, raw; None for an absent value), in the call's order."""
    return sample_tables_of_calls([(identity, leaves, step)], counter)[0]


def sample_tables_of_calls(calls: Sequence[tuple[CallIdentity, Sequence[Any], int]],
                           counter: OccurrenceCounter) -> list[pa.Table]:
    """The `sample` rows of each of several save calls (identity, leaves, step), given in the order
    they were made (occurrences count through them). Built as whole columns of one table, sliced
    per call: a fixed number of numpy and Arrow calls for the lot, whatever its call and key
    counts (tensors of one layout are reduced together: numpy reduces each row of a stack
    exactly as the row alone)."""
    entries: list[tuple[Any, int]] = []  # (job, rows) per batch tensor, in call order
    ids_parts, steps = [], []
    text_parts: list[str | None] = []  # each call's n ids as given (None: derived), once a call
    group_parts: list[str | None] = []
    call_start: list[int] = []  # per batch tensor: where its call's ids start in text_parts
    call_rows = [0] * len(calls)
    _resolve_together([identity for identity, _, _ in calls])
    counted: list[tuple[int, list[tuple[str, str]], np.ndarray]] = []  # occurrences count through the calls in order
    for c, (identity, leaves, step) in enumerate(calls):
        n = identity.rows
        if n == 0:  # an empty batch has no rows
            continue
        batch = [job for job in leaves if job.leaf is not None and job.leaf.raw is not None
                 and len(job.leaf.shape) > 0 and job.leaf.shape[0] == n]
        if not batch:
            continue
        if identity.explicit is not None:
            ids, text = identity.explicit, identity.explicit_text
        else:
            ids, text = row_hashes(leaves[identity.prompt_leaf].leaf.raw), None  # type: ignore[index]
        k = len(batch)
        entries.extend((job, n) for job in batch)
        steps.extend([step] * k)
        call_rows[c] = k * n
        counted.append((step, [(job.key, job.index) for job in batch], ids))
        ids_parts += [ids.view(np.int64)] * k
        call_start.extend([len(text_parts)] * k)
        text_parts += text if text is not None else [None] * n
        group_parts += identity.groups if identity.groups is not None else [None] * n
    if not entries:
        return [SAMPLE.empty_table()] * len(calls)
    occurrence_parts = counter.occurrences_of_calls(counted)
    counts = np.array([n for _, n in entries], np.int64)
    offsets = np.cumsum(counts) - counts
    total = int(counts.sum())
    hashes = np.empty(total, np.uint64)
    sums, mins, maxs = (np.full(total, np.nan) for _ in range(3))
    widths = np.empty(len(entries), np.int64)
    raws = [job.leaf.raw for job, _ in entries]
    layouts = [(job.leaf.dtype, r.dtype, n, r.size // n) for (job, n), r in zip(entries, raws)]
    for members in stack_groups(layouts, [r.nbytes for r in raws], STACK_BYTES):
        n = entries[members[0]][1]
        raw = [raws[i].reshape(n, -1) for i in members]
        rows = raw[0][None] if len(raw) == 1 else np.stack(raw)  # (tensors, rows, width)
        at = np.asarray(members)
        where = (offsets[at][:, None] + np.arange(n)).reshape(-1)
        widths[at] = rows.shape[2]
        hashes[where] = row_hashes(rows.reshape(len(members) * n, -1))
        if rows.shape[2]:
            values = widen(rows, entries[members[0]][0].leaf.dtype).astype(np.float64, copy=False)
            sums[where], mins[where], maxs[where] = (values.sum(axis=2).reshape(-1), values.min(axis=2).reshape(-1),
                                                     values.max(axis=2).reshape(-1))
    # the text columns converted once a batch tensor (key, index, dtype) or once a call (the ids as given),
    # then repeated by Arrow's take: a Python string a row cost ~6 % of the writer's CPU (docs/trl.md)
    entry = np.repeat(np.arange(len(entries)), counts)
    row = np.arange(total) - np.repeat(offsets, counts)
    given = np.repeat(np.array(call_start, np.int64), counts) + row
    columns = {
        "key": _text([job.key for job, _ in entries]).take(entry),
        "index": _text([job.index for job, _ in entries]).take(entry),
        "step": np.repeat(np.array(steps, np.int64), counts),
        "micro_step": np.repeat(np.array([job.micro_step for job, _ in entries], np.int64), counts),
        "row": row, "sample": np.concatenate(ids_parts),
        "sample_id": _text(text_parts).take(given), "occurrence": np.concatenate(occurrence_parts),
        "group_id": _text(group_parts).take(given),
        "dtype": _text([job.leaf.dtype for job, _ in entries]).take(entry), "row_numel": np.repeat(widths, counts),
        "row_hash": hashes.view(np.int64), "row_sum": sums, "row_min": mins, "row_max": maxs,
    }
    arrays = [(f, columns[f.name]) for f in SAMPLE]
    table = pa.Table.from_arrays([a if isinstance(a, pa.Array) else pa.array(a, f.type) for f, a in arrays],
                                 schema=SAMPLE)
    starts = np.cumsum([0, *call_rows]).tolist()
    return [table.slice(start, rows) for start, rows in zip(starts, call_rows)]


def _text(values: list[str | None]) -> pa.Array:
    """A Python list of strings (None: null) as an Arrow string array. A list, not an object array, which
    pyarrow converts through pandas."""
    return pa.array(values, pa.string())


def _resolve_together(identities: Sequence[CallIdentity]) -> None:
    """CallIdentity.resolve of each, the integer ids of all hashed by one row_hashes call (a row's
    hash depends on its bytes alone, so the values are those of one call at a time)."""
    pending = [identity for identity in identities if identity.int_ids is not None]
    if len(pending) > 1:
        hashes = row_hashes(np.concatenate([identity.int_ids for identity in pending]).reshape(-1, 1))
        at = 0
        for identity in pending:
            n = len(identity.int_ids)  # type: ignore[arg-type]
            identity.explicit_text = [str(v) for v in identity.int_ids.tolist()]  # type: ignore[union-attr]
            identity.explicit, identity.int_ids, at = hashes[at:at + n], None, at + n
    for identity in identities:
        identity.resolve()
