"""Gradient statistics and parameter fingerprints shared by every framework: the host-side batches, the
numpy kernels, the `mix64` digest and the rows of the `grad` table (contract: docs/grads.md) and of the
`param` table (docs/dump-format.md, "param").

A parameter's fingerprint after an optimizer step is `mix64` of its raw bytes (the gradient monitor's L0
digest: any changed bit changes it, bit-exact on one device) plus its float64 sum and L2 norm, which two
runs whose reductions differ in order (other data-parallel layouts) match within a tolerance where the
digest cannot."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

LEVELS = ("L0", "L1", "L2")
DIGEST_ALGO = "mix64"
# stats matrix columns, one row per parameter: then one cumulative count (x <= bound) per bound
STAT_COLUMNS = ("max", "min", "norm", "zero_count")
# 64-bit odd constants (golden ratio, splitmix64), as signed int64
MIX_K1 = -7046029254386353131
MIX_K2 = -4658895280553007687
# little-endian 8 bools (0/1 bytes) as one int64 -> np.packbits byte (big-endian bit order)
PACK_MAGIC = -9205322385119247871  # 0x8040201008040201


@dataclass
class GradBatch:
    """One monitor's step on the host: stats (float64 [n, 4 + len(bounds)]), digests (uint64 [n]
    or None), packed signs (uint8, each parameter starting on a byte boundary) or None. When the
    arrays are views of a staging ring slot, `release` gives the slot back once they are written."""

    stats: np.ndarray
    digests: np.ndarray | None
    signs: np.ndarray | None
    sign_offsets: list[int]
    release: Callable[[], None] | None = None


@dataclass
class GradSpec:
    """What one monitored parameter looked like at capture time."""

    param: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def padded_bytes(numel: int) -> int:
    return (numel + 7) // 8


def sign_offsets(numels: Sequence[int]) -> list[int]:
    offsets, at = [], 0
    for n in numels:
        offsets.append(at)
        at += padded_bytes(n)
    return offsets


def mix64_numpy(raw: np.ndarray) -> int:
    """The `mix64` digest of an array's raw bytes (C order); equals the device version in torch_grads."""
    b = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    pad = (-b.size) % 4
    if pad:
        b = np.concatenate([b, np.zeros(pad, np.uint8)])
    w = b.view("<u4").astype(np.int64)
    i = np.arange(w.size, dtype=np.int64)
    with np.errstate(over="ignore"):
        h = (w ^ (i * np.int64(MIX_K1))) * np.int64(MIX_K2)
        h = h ^ (h >> np.int64(31))
        return int(h.sum(dtype=np.int64)) & 0xFFFFFFFFFFFFFFFF


def host_batch(arrays: Sequence[np.ndarray], level: str, bounds: Sequence[float]) -> GradBatch:
    """The numpy kernel (MindSpore on the CPU, and the reference the device kernels are tested against).
    Stats columns: STAT_COLUMNS, then at L2 one cumulative count (x <= bound) per bound."""
    bounds = list(bounds) if level == "L2" else []
    k = len(STAT_COLUMNS) + len(bounds)
    stats = np.zeros((len(arrays), k), np.float64)
    for r, a in enumerate(arrays):
        f = a.reshape(-1)
        if f.size == 0:
            stats[r, :3] = np.nan
            continue
        f = f.astype(np.float32) if f.dtype.itemsize < 4 or not np.issubdtype(f.dtype, np.floating) else f
        stats[r, 0], stats[r, 1] = float(f.max()), float(f.min())
        stats[r, 2] = float(np.linalg.norm(f))
        stats[r, 3] = np.count_nonzero(f == 0)
        for j, bound in enumerate(bounds):
            stats[r, 4 + j] = np.count_nonzero(f <= bound)
    digests = np.array([mix64_numpy(a) for a in arrays], np.uint64) if level == "L0" else None
    signs = None
    offsets = sign_offsets([a.size for a in arrays])
    if level != "L0":
        signs = np.concatenate([np.packbits(a.reshape(-1) > 0) for a in arrays]) if arrays else np.zeros(0, np.uint8)
    return GradBatch(stats, digests, signs, offsets)


def grad_rows(batch: GradBatch, specs: Sequence[GradSpec], *, monitor: str, step: int, probe_step: int,
              level: str, framework: str, bounds: Sequence[float], sign_file: str | None) -> list[dict[str, Any]]:
    """Rows of the `grad` table for one monitor step (contents per level as in msprobe's grad_probe)."""
    rows = []
    for r, spec in enumerate(specs):
        s = batch.stats[r]
        n = spec.numel
        row: dict[str, Any] = {
            "monitor": monitor, "param": spec.param, "step": step, "probe_step": probe_step, "level": level,
            "framework": framework, "dtype": spec.dtype, "shape": list(spec.shape), "numel": n,
            "max": float(s[0]), "min": float(s[1]), "norm": float(s[2]),
            "digest": None, "digest_algo": None, "bounds": None, "bucket_fractions": None, "zero_fraction": None,
            "sign_file": None, "sign_offset": None, "sign_numel": None,
        }
        if batch.digests is not None:
            row["digest"] = f"{int(batch.digests[r]):016x}"
            row["digest_algo"] = DIGEST_ALGO
        if level == "L2" and n:
            cumulative = [float(c) for c in s[4:]] + [float(n)]
            row["bounds"] = [float(b) for b in bounds]
            row["bucket_fractions"] = [(c - p) / n for p, c in zip([0.0] + cumulative[:-1], cumulative)]
            row["zero_fraction"] = float(s[3]) / n
        if batch.signs is not None and sign_file is not None:
            row["sign_file"] = sign_file
            row["sign_offset"] = batch.sign_offsets[r]
            row["sign_numel"] = n
        rows.append(row)
    return rows


def check_level(level: Any) -> str:
    if level not in LEVELS:
        raise ValueError(f"level={level!r}: expected one of {', '.join(LEVELS)} (L0 digest+stats, L1 stats+signs, "
                         "L2 L1 plus the distribution over bounds)")
    return level


def check_bounds(bounds: Any) -> list[float]:
    try:
        values = [float(b) for b in bounds]
    except (TypeError, ValueError):
        raise ValueError(f"bounds={bounds!r}: expected a list of numbers in increasing order, "
                         "e.g. [-1, 0, 1]") from None
    if not values or any(not math.isfinite(v) for v in values) or any(b <= a for a, b in zip(values, values[1:])):
        raise ValueError(f"bounds={bounds!r}: expected finite numbers in strictly increasing order, e.g. [-1, 0, 1]")
    return values


Finish = Callable[[], GradBatch]


# -- parameter fingerprints ---------------------------------------------------------------------------------

FLOAT_COLUMNS = ("sum", "norm")


@dataclass
class ParamBatch:
    """One monitor's step on the host: digests (uint64 [n]) and floats (float64 [n, 2]: sum, norm)."""

    digests: np.ndarray
    floats: np.ndarray


def host_fingerprints(arrays: Sequence[np.ndarray], raw: Sequence[np.ndarray] | None = None) -> ParamBatch:
    """The numpy reference (MindSpore, and what the device paths are tested against). `raw`: the
    arrays whose bytes are digested where they differ from the values summed (bf16 kept as its
    16-bit words, summed as float32); default: `arrays` themselves."""
    floats = np.zeros((len(arrays), len(FLOAT_COLUMNS)), np.float64)
    for r, a in enumerate(arrays):
        f = a.reshape(-1).astype(np.float64)
        floats[r] = (f.sum(), np.sqrt(np.dot(f, f))) if f.size else (0.0, 0.0)
    digests = np.array([mix64_numpy(a) for a in (arrays if raw is None else raw)], np.uint64)
    return ParamBatch(digests, floats)


def param_rows(batch: ParamBatch, specs: Sequence[GradSpec], positions: Sequence[int], *, monitor: str, step: int,
               probe_step: int, framework: str) -> list[dict[str, Any]]:
    """Rows of the `param` table for one monitor step."""
    return [{"monitor": monitor, "param": spec.param, "position": int(pos), "step": step, "probe_step": probe_step,
             "framework": framework, "dtype": spec.dtype, "shape": list(spec.shape), "numel": spec.numel,
             "digest": f"{int(batch.digests[r]):016x}", "digest_algo": DIGEST_ALGO,
             "sum": float(batch.floats[r, 0]), "norm": float(batch.floats[r, 1])}
            for r, (spec, pos) in enumerate(zip(specs, positions))]


@dataclass(frozen=True)
class WeightSpec:
    """One parameter of a hooked module at a stage block's start (capture/stage_weights.py)."""

    module: str  # the module's path in the stage, as its module rows name it
    param: str  # the parameter's own name in that module ("weight", "bias")
    block: int  # the stage's block in this step
    call: int  # the module's forward calls in this stage and step before the block (its next call's number)
    position: int  # its place among the block's parameters (the model's order)
    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        import math

        return math.prod(self.shape)


def module_weight_rows(batch: ParamBatch, specs: Sequence[WeightSpec], *, stage: str, step: int,
                       framework: str) -> list[dict[str, Any]]:
    """Rows of the `module_param` table for one stage block."""
    return [{"stage": stage, "step": step, "block": spec.block, "module": spec.module, "call": spec.call,
             "param": spec.param,
             "position": spec.position, "framework": framework, "dtype": spec.dtype, "shape": list(spec.shape),
             "numel": spec.numel, "digest": f"{int(batch.digests[r]):016x}", "digest_algo": DIGEST_ALGO,
             "sum": float(batch.floats[r, 0]), "norm": float(batch.floats[r, 1])}
            for r, spec in enumerate(specs)]
