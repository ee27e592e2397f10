"""The gradient probe's GPU kernel (L1/L2): every gradient of a step read once, in Triton.

Stage one is one launch per gradient dtype over a table of chunks (a chunk is CHUNK elements of
one gradient, located through a table of the gradients' addresses): each program reads its chunk
once and writes a partial row (the max and min as order-preserving integer keys, the float64 sum
of squares, the nonzero count and one count of x <= bound per bound) and the chunk's packed sign
bits (np.packbits order, 1 = x > 0, padding bits 0) straight into the step's payload. Stage two,
one launch, reduces each gradient's partial rows into its stats row (max, min, norm, zero count,
counts) in the same payload. A side stream copies the payload to a pinned host ring slot, so the
copy (tens of MB of signs) runs beside the next step's work instead of in the training stream;
the next step's kernels wait for it on the device before rewriting the payload. Buffers and
tables are made once per parameter layout (`GradStatsKernel` keeps them); a step allocates
nothing on the device, and the address table is uploaded only when a gradient moved. Semantics
are those of lake/grad_stats.host_batch (contract: docs/grads.md).

The same kernels run on CPU tensors under the Triton interpreter (TRITON_INTERPRET=1 set before
Triton is imported), which is how the CPU test suite checks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
import triton
import triton.language as tl

from rlprobe.lake.grad_stats import STAT_COLUMNS, GradBatch, padded_bytes, sign_offsets

# Launch shape: a program reads CHUNK elements in tiles of BLOCK (a multiple of 8: a tile fills
# whole sign bytes); benchmarks/grad_kernel_sweep.py measures the alternatives on a GPU.
BLOCK = 2048
CHUNK = 16 * BLOCK
NUM_WARPS = 8
REDUCE_BLOCK = 128  # partial rows a stage-two program reduces at a time

# what stage one loads each gradient dtype as: bf16 as its 16-bit patterns, widened by a shift
DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.uint16, torch.float16: tl.float16}
_INT32_MIN = tl.constexpr(-(2 ** 31))  # kernels may read module globals only as constexpr
_INT32_MAX = tl.constexpr(2 ** 31 - 1)


@triton.jit
def _order_key(x):
    """float32 -> int32 that orders like the floats, -0.0 below +0.0 (its own inverse)."""
    i = x.to(tl.int32, bitcast=True)
    return i ^ ((i >> 31) & 0x7FFFFFFF)


@triton.jit
def _widen(v, BF16: tl.constexpr):
    """Loaded values as float32, exactly. bf16 patterns shifted into float32's upper half: exact,
    subnormals included (the interpreter's bf16 cast flushes them, and keeps bf16 as raw bits)."""
    if BF16:
        return (v.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return v.to(tl.float32)


@triton.jit
def _accumulate(x, m, kmax, kmin, ss, nonzero, le, b, NB: tl.constexpr):
    """Fold one tile (x: float32 [BLOCK // 8, 8], m: which lanes hold values; x is 0 elsewhere)
    into the per-lane accumulators."""
    key = _order_key(x)
    kmax = tl.maximum(kmax, tl.where(m, key, _INT32_MIN))
    kmin = tl.minimum(kmin, tl.where(m, key, _INT32_MAX))
    xd = x.to(tl.float64)
    ss += xd * xd  # NaN exactly when a NaN is present: the terms are >= 0, infinities never cancel
    nonzero += (x != 0).to(tl.int32)
    if NB > 0:
        le += ((x[None, :, :] <= b) & m[None, :, :]).to(tl.int32)
    return kmax, kmin, ss, nonzero, le


@triton.jit
def _pack_signs(x):
    """Each row of 8 values as one byte, np.packbits order: 1 = x > 0 (0 for 0, negatives, NaN)."""
    return tl.sum((x > 0).to(tl.int32) << (7 - tl.arange(0, 8)[None, :]), axis=1).to(tl.uint8)


@triton.jit
def _chunk_stats(chunk_param, chunk_start, addrs, numels, sign_at, bounds, part_keys, part_ss, part_counts,
                 payload, chunk_base, DTYPE: tl.constexpr, BF16: tl.constexpr, NB: tl.constexpr, NBP: tl.constexpr,
                 SIGNS: tl.constexpr, ALIGNED: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """One chunk of one gradient: its partial row, and its sign bytes at sign_at[p] + start / 8."""
    c = chunk_base + tl.program_id(0)
    p = tl.load(chunk_param + c)
    start = tl.multiple_of(tl.load(chunk_start + c), CHUNK)
    size = tl.minimum(tl.load(numels + p) - start, CHUNK)  # elements in this chunk
    src = tl.load(addrs + p).to(tl.pointer_type(DTYPE))
    if ALIGNED:  # every gradient starts on 16 bytes (checked on the host): vector loads are safe
        src = tl.multiple_of(src, 16)
    signs_out = payload + tl.load(sign_at + p)
    # a tile as [BLOCK // 8, 8]: one row per sign byte, so packing is a sum along a row
    row = tl.arange(0, BLOCK // 8)
    lane = row[:, None] * 8 + tl.arange(0, 8)[None, :]
    everywhere = tl.full([BLOCK // 8, 8], 1, tl.int1)
    kmax = tl.full([BLOCK // 8, 8], _INT32_MIN, tl.int32)
    kmin = tl.full([BLOCK // 8, 8], _INT32_MAX, tl.int32)
    ss = tl.zeros([BLOCK // 8, 8], tl.float64)
    nonzero = tl.zeros([BLOCK // 8, 8], tl.int32)
    j = tl.arange(0, NBP)
    b = tl.load(bounds + j, mask=j < NB, other=float("nan"))[:, None, None]  # NaN pads: never <=
    le = tl.zeros([NBP, BLOCK // 8, 8], tl.int32)
    full = size // BLOCK
    # whole tiles without a mask, so the loads are vectorized; then the last, partial tile
    for i in range(0, full):
        at = start + i * BLOCK
        x = _widen(tl.load(src + at + lane), BF16)
        kmax, kmin, ss, nonzero, le = _accumulate(x, everywhere, kmax, kmin, ss, nonzero, le, b, NB)
        if SIGNS:
            tl.store(signs_out + at // 8 + row, _pack_signs(x))
    if full * BLOCK < size:
        at = start + full * BLOCK
        m = full * BLOCK + lane < size
        x = _widen(tl.load(src + at + lane, mask=m, other=0), BF16)
        kmax, kmin, ss, nonzero, le = _accumulate(x, m, kmax, kmin, ss, nonzero, le, b, NB)
        if SIGNS:  # masked lanes are 0: the padding bits of the last byte are 0
            tl.store(signs_out + at // 8 + row, _pack_signs(x), mask=full * BLOCK + row * 8 < size)
    tl.store(part_keys + 2 * c, tl.max(tl.max(kmax, axis=1), axis=0))
    tl.store(part_keys + 2 * c + 1, tl.min(tl.min(kmin, axis=1), axis=0))
    tl.store(part_ss + c, tl.sum(tl.sum(ss, axis=1), axis=0))
    tl.store(part_counts + (NB + 1) * c, tl.sum(tl.sum(nonzero, axis=1), axis=0))
    if NB > 0:
        tl.store(part_counts + (NB + 1) * c + 1 + j, tl.sum(tl.sum(le, axis=2), axis=1), mask=j < NB)


@triton.jit
def _key_to_float(key):
    return (key ^ ((key >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True).to(tl.float64)


@triton.jit
def _param_rows(chunk_range, numels, part_keys, part_ss, part_counts, stats,
                NB: tl.constexpr, NBP1: tl.constexpr, R: tl.constexpr):
    """One gradient's stats row from its partial rows: max, min, norm, zero count, x <= bound."""
    p = tl.program_id(0)
    c0 = tl.load(chunk_range + 2 * p)
    c1 = tl.load(chunk_range + 2 * p + 1)
    n = tl.load(numels + p)
    r = tl.arange(0, R)
    col = tl.arange(0, NBP1)
    kmax = tl.full([R], _INT32_MIN, tl.int32)
    kmin = tl.full([R], _INT32_MAX, tl.int32)
    ss = tl.zeros([R], tl.float64)
    counts = tl.zeros([R, NBP1], tl.int64)
    for c in range(c0, c1, R):
        m = c + r < c1
        kmax = tl.maximum(kmax, tl.load(part_keys + 2 * (c + r), mask=m, other=_INT32_MIN))
        kmin = tl.minimum(kmin, tl.load(part_keys + 2 * (c + r) + 1, mask=m, other=_INT32_MAX))
        ss += tl.load(part_ss + c + r, mask=m, other=0.0)
        counts += tl.load(part_counts + (NB + 1) * (c + r)[:, None] + col[None, :],
                          mask=m[:, None] & (col[None, :] < NB + 1), other=0).to(tl.int64)
    total = tl.sum(ss, axis=0)
    count = tl.sum(counts, axis=0)
    bad = (total != total) | (c0 == c1)  # a NaN, or an empty gradient: max, min and norm are NaN
    nan = float("nan")
    mx = tl.where(bad, nan, _key_to_float(tl.max(kmax, axis=0)))
    mn = tl.where(bad, nan, _key_to_float(tl.min(kmin, axis=0)))
    # the norm as the host kernels give it: sqrt of the float64 sum, rounded to float32 (float64
    # sqrt is correctly rounded on the GPU: PTX has only sqrt.rn.f64)
    norm = tl.where(bad, nan, tl.sqrt(total).to(tl.float32).to(tl.float64))
    row = stats + (4 + NB) * p
    tl.store(row, mx)
    tl.store(row + 1, mn)
    tl.store(row + 2, norm)
    # counts[0] is the nonzero count: the zero count is numel minus it
    tl.store(row + 3 + col, tl.where(col == 0, n - count, count).to(tl.float64), mask=col < NB + 1)


@dataclass
class _Layout:
    """Device tables and buffers for one list of (dtype, numel), made once and reused."""

    groups: list[tuple[torch.dtype, int, int]]  # (dtype, first chunk, chunk count), one per dtype
    offsets: list[int]  # each gradient's first sign byte
    signs: bool  # whether the payload holds sign bytes after the stats
    k: int  # stats columns
    addrs: tuple[int, ...]  # the addresses addr_table holds
    aligned: bool  # whether they all are multiples of 16
    addr_table: torch.Tensor  # int64 [n]
    chunk_param: torch.Tensor  # int32 [chunks]: the gradient a chunk belongs to
    chunk_start: torch.Tensor  # int64 [chunks]: its first element
    chunk_range: torch.Tensor  # int64 [n, 2]: a gradient's chunks (first, end)
    numel_table: torch.Tensor  # int64 [n]
    sign_at: torch.Tensor  # int64 [n]: where a gradient's sign bytes start in the payload
    bounds: torch.Tensor  # float32 [max(1, len(bounds))]
    part_keys: torch.Tensor  # int32 [chunks, 2]: max and min as order keys
    part_ss: torch.Tensor  # float64 [chunks]
    part_counts: torch.Tensor  # int32 [chunks, 1 + len(bounds)]: nonzero, then x <= bound
    payload: torch.Tensor  # uint8: float64 stats [n, k], then the packed signs (if any)
    stats: torch.Tensor  # the payload's stats, as float64
    copy_stream: Any = None  # CUDA: the side stream that copies the payload to the host
    kernels_done: Any = None  # CUDA: recorded after the kernels, waited for by copy_stream
    copied: Any = None  # CUDA: the last copy's event, waited for before the payload is rewritten


class GradStatsKernel:
    """The fused statistics of one monitor's gradients; keeps its device buffers between steps."""

    def __init__(self, block: int = BLOCK, chunk: int = CHUNK, num_warps: int = NUM_WARPS):
        if block < 8 or block & (block - 1) or chunk < block or chunk % block:
            raise ValueError(f"block={block}, chunk={chunk}: expected block a power of two >= 8 and chunk a "
                             "multiple of block")
        self.block, self.chunk, self.num_warps = block, chunk, num_warps
        self._layout: _Layout | None = None
        self._key: Any = None

    @staticmethod
    def supports(grads: Sequence[torch.Tensor]) -> bool:
        """Whether this kernel reads every one of these gradients (float32, bfloat16, float16,
        contiguous); the caller falls back to torch ops otherwise."""
        return all(g.dtype in DTYPES and g.is_contiguous() for g in grads)

    def launch(self, flats: Sequence[torch.Tensor], bounds: Sequence[float] | None,
               signs: bool = True) -> tuple[Callable[[], GradBatch], int]:
        """Queue the statistics of the contiguous tensors `flats` (one device; float32, bfloat16,
        float16; any shape, read in memory order) on the current stream: columns STAT_COLUMNS,
        then x <= bound per bound when `bounds` is given, and the packed signs when `signs`.
        Returns (finish, host bytes): `finish()` waits for the copy and returns a GradBatch of
        views into a host ring slot, which `GradBatch.release()` gives back."""
        device = flats[0].device
        if device.type == "cuda" and device.index != torch.cuda.current_device():
            with torch.cuda.device(device):  # Triton launches, the copy and the event on its device
                return self.launch(flats, bounds, signs)
        lay = self.run_kernels(flats, bounds, signs)
        return _to_host(lay, len(flats)), int(lay.payload.numel())

    def run_kernels(self, flats: Sequence[torch.Tensor], bounds: Sequence[float] | None,
                    signs: bool = True) -> _Layout:
        """The two stages alone (what `launch` queues before the copy to the host); the results
        are in the returned layout's payload."""
        device = flats[0].device
        bounds = tuple(float(b) for b in bounds) if bounds is not None else ()
        lay = self._prepare(flats, bounds, signs, device)
        if lay.copied is not None:  # the last step's copy still reading the payload (on the device)
            torch.cuda.current_stream(device).wait_event(lay.copied)
        addrs = tuple(f.data_ptr() for f in flats)
        if addrs != lay.addrs:  # a gradient was reallocated (zero_grad(set_to_none=True) frees them)
            _copy_in(lay.addr_table, addrs)
            lay.addrs, lay.aligned = addrs, all(a % 16 == 0 for a in addrs)
        nb = len(bounds)
        for dtype, first, count in lay.groups:
            _chunk_stats[(count,)](lay.chunk_param, lay.chunk_start, lay.addr_table, lay.numel_table, lay.sign_at,
                                   lay.bounds, lay.part_keys, lay.part_ss, lay.part_counts, lay.payload, first,
                                   DTYPE=DTYPES[dtype], BF16=dtype == torch.bfloat16, NB=nb, NBP=_pow2(nb),
                                   SIGNS=signs, ALIGNED=lay.aligned, CHUNK=self.chunk, BLOCK=self.block,
                                   num_warps=self.num_warps, enable_fp_fusion=True)
        _param_rows[(len(flats),)](lay.chunk_range, lay.numel_table, lay.part_keys, lay.part_ss, lay.part_counts,
                                   lay.stats, NB=nb, NBP1=_pow2(nb + 1), R=REDUCE_BLOCK, num_warps=4,
                                   enable_fp_fusion=True)
        return lay

    def _prepare(self, flats: Sequence[torch.Tensor], bounds: tuple[float, ...], signs: bool,
                 device: torch.device) -> _Layout:
        key = (device, bounds, signs, tuple((f.dtype, f.numel()) for f in flats))
        if key != self._key or self._layout is None:
            for f in flats:
                if f.device != device or f.dtype not in DTYPES or not f.is_contiguous():
                    raise ValueError(f"GradStatsKernel: expected contiguous float32/bfloat16/float16 tensors "
                                     f"on {device}, got {f.dtype} {tuple(f.shape)} on {f.device}")
            self._layout = _make_layout(flats, bounds, signs, device, self.chunk)
            self._key = key
        return self._layout


def _pow2(n: int) -> int:
    """The least power of two >= max(n, 1) (Triton block shapes are powers of two)."""
    return 1 << max(0, n - 1).bit_length()


def _copy_in(table: torch.Tensor, values: Sequence[int] | np.ndarray) -> None:
    """Host values into a device table without synchronising the host: a non-blocking copy from
    pinned memory, which torch's host allocator keeps until the copy has run."""
    host = torch.as_tensor(np.asarray(values)).to(table.dtype)
    if table.device.type == "cuda":
        host = host.pin_memory()
    table.copy_(host, non_blocking=True)


def _device(values: Sequence[int] | np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = torch.empty(len(values), dtype=dtype, device=device)
    _copy_in(t, values)
    return t


def _make_layout(flats: Sequence[torch.Tensor], bounds: tuple[float, ...], signs: bool, device: torch.device,
                 chunk: int) -> _Layout:
    n = len(flats)
    numels = [f.numel() for f in flats]
    offsets = sign_offsets(numels)
    n_sign_bytes = sum(padded_bytes(m) for m in numels) if signs else 0
    k = len(STAT_COLUMNS) + len(bounds)
    # chunks grouped by dtype (one stage-one launch per dtype), each gradient's chunks adjacent
    chunk_param: list[int] = []
    chunk_start: list[int] = []
    chunk_range = np.zeros((n, 2), np.int64)
    groups = []
    for dtype in dict.fromkeys(f.dtype for f in flats):
        first = len(chunk_param)
        for p, f in enumerate(flats):
            if f.dtype == dtype:
                chunk_range[p, 0] = len(chunk_param)
                chunk_param.extend([p] * -(-numels[p] // chunk))
                chunk_start.extend(range(0, numels[p], chunk))
                chunk_range[p, 1] = len(chunk_param)
        if len(chunk_param) > first:
            groups.append((dtype, first, len(chunk_param) - first))
    chunks = max(1, len(chunk_param))
    payload = torch.empty(n * k * 8 + n_sign_bytes, dtype=torch.uint8, device=device)
    copy_stream = kernels_done = None
    if device.type == "cuda":
        copy_stream, kernels_done = torch.cuda.Stream(device), torch.cuda.Event()
        payload.record_stream(copy_stream)  # freed later: not reused before that stream's copies end
    return _Layout(
        groups=groups, offsets=offsets, signs=signs, k=k, addrs=(), aligned=False,
        addr_table=torch.zeros(n, dtype=torch.int64, device=device),
        chunk_param=_device(chunk_param or [0], torch.int32, device),
        chunk_start=_device(chunk_start or [0], torch.int64, device),
        chunk_range=_device(chunk_range.reshape(-1), torch.int64, device),
        numel_table=_device(numels, torch.int64, device),
        sign_at=_device([n * k * 8 + o for o in offsets], torch.int64, device),
        bounds=_device(np.asarray(bounds or (0.0,), np.float32), torch.float32, device),
        part_keys=torch.empty(2 * chunks, dtype=torch.int32, device=device),
        part_ss=torch.empty(chunks, dtype=torch.float64, device=device),
        part_counts=torch.empty((1 + len(bounds)) * chunks, dtype=torch.int32, device=device),
        payload=payload, stats=payload[: n * k * 8].view(torch.float64), copy_stream=copy_stream,
        kernels_done=kernels_done,
    )


def _to_host(lay: _Layout, n: int) -> Callable[[], GradBatch]:
    """One non-blocking copy of the payload into a slot of the device's host staging ring (a
    buffer of its own when it can never fit), on the side stream on CUDA, and one event; the
    finish function waits for it."""
    from rlprobe.frameworks.staging import host_ring, pinned_ring

    payload = lay.payload
    cuda = payload.device.type == "cuda"
    slot = (pinned_ring(payload.device) if cuda else host_ring()).alloc(payload.numel())
    give_back = None
    if slot is None:
        host = torch.empty(payload.numel(), dtype=torch.uint8, pin_memory=cuda)
    else:
        host, give_back = slot
        host = torch.from_numpy(host) if isinstance(host, np.ndarray) else host
    event = None
    if cuda:
        lay.kernels_done.record()
        lay.copy_stream.wait_event(lay.kernels_done)
        with torch.cuda.stream(lay.copy_stream):
            host.copy_(payload, non_blocking=True)
            event = lay.copied = torch.cuda.Event()
            event.record()
    else:
        host.copy_(payload)
    at, k, offsets, with_signs = n * lay.k * 8, lay.k, lay.offsets, lay.signs

    def finish() -> GradBatch:
        try:
            if event is not None:
                event.synchronize()
        except BaseException:
            if give_back is not None:
                give_back()
            raise
        raw = host.numpy()
        signs = raw[at:] if with_signs else None
        return GradBatch(raw[:at].view(np.float64).reshape(n, k), None, signs, offsets, release=give_back)

    return finish
