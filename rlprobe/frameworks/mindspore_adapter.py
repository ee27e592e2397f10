"""MindSpore tensors (CPU, pynative). Statistics come from a host snapshot on the writer thread."""

from __future__ import annotations

import os
from typing import Any, Sequence

import mindspore as ms
import numpy as np

from rlprobe.errors import ProbeError
from rlprobe.frameworks.base import StagedLeaf
from rlprobe.lake.encoding import SUPPORTED

_NAMES = {
    "Bool": "bool", "Int8": "int8", "Int16": "int16", "Int32": "int32", "Int64": "int64",
    "UInt8": "uint8", "UInt16": "uint16", "UInt32": "uint32", "UInt64": "uint64",
    "Float16": "float16", "BFloat16": "bfloat16", "Float32": "float32", "Float64": "float64",
}


def _dtype_name(t: Any) -> str:
    name = _NAMES.get(str(t.dtype))
    if name is None:
        raise ProbeError(f"unsupported MindSpore dtype {t.dtype}; supported: {', '.join(SUPPORTED)}")
    return name


class MindSporeAdapter:
    name = "mindspore"

    def is_tensor(self, value: Any) -> bool:
        return isinstance(value, ms.Tensor)

    def dtype_name(self, value: Any) -> str:
        return _dtype_name(value)

    def stage(self, values: Sequence[Any], keep_raw: bool) -> list[StagedLeaf]:
        leaves = []
        for t in values:
            dtype = _dtype_name(t)
            if dtype == "bfloat16":
                # numpy has no bfloat16: widen exactly, then keep the top 16 bits as the raw bytes
                wide = np.asarray(t.astype(ms.float32).asnumpy(), order="C")  # keeps 0-d (ascontiguousarray makes it 1-d)
                raw = (wide.view(np.uint32) >> 16).astype(np.uint16)
            else:
                raw = np.array(t.asnumpy(), copy=True, order="C")
            leaves.append(StagedLeaf(dtype, tuple(raw.shape), raw, nbytes=raw.nbytes))
        return leaves

    def rank_and_world(self) -> tuple[int, int] | None:
        return mindspore_rank_and_world()


def mindspore_rank_and_world() -> tuple[int, int] | None:
    try:
        from mindspore import communication as comm

        if os.environ.get("MS_ROLE") or os.environ.get("RANK_TABLE_FILE") or os.environ.get("MS_WORKER_NUM"):
            return comm.get_rank(), comm.get_group_size()
    except Exception:  # communication not initialised: not a distributed MindSpore job
        return None
    return None
