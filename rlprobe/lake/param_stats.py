"""Parameter fingerprints shared by every framework: the host-side batch, the numpy reference
and the rows of the `param` table (contract: docs/dump-format.md, "param").

A fingerprint of one parameter tensor after an optimizer step: `mix64` of its raw bytes (the
gradient monitor's L0 digest: any changed bit changes it, bit-exact on one device) plus its
float64 sum and L2 norm, which two runs whose reductions differ in order (other data-parallel
layouts) match within a tolerance where the digest cannot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from rlprobe.lake.grad_stats import DIGEST_ALGO, GradSpec, mix64_numpy

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
