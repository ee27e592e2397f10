"""Drop-in replacements for msprobe 8.x entry points: change one import line to move over.

    from rlprobe.compat.msprobe import SingleSave     # was: from msprobe.core import SingleSave
    SingleSave("./dump_path", fmk="pytorch")
    SingleSave.save({"response": response})
    SingleSave.step()

Unlike msprobe, a second SingleSave(...) with another dump_path really switches to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from rlprobe.capture.probe import Probe
from rlprobe.errors import ProbeError

_FMK = {"pytorch": "torch", "torch": "torch", "mindspore": "mindspore", "numpy": "numpy"}


class SingleSave:
    """msprobe's SingleSave call shape, writing an rlprobe dump."""

    _probes: ClassVar[dict[Path, Probe]] = {}
    _current: ClassVar[Probe | None] = None

    def __init__(self, dump_path: str, fmk: str = "pytorch", **probe_options: Any):
        if fmk not in _FMK:
            raise ProbeError(f"SingleSave: fmk={fmk!r}; expected 'pytorch' or 'mindspore'")
        key = Path(dump_path).resolve()
        probe = SingleSave._probes.get(key)
        if probe is None or probe.closed:
            probe = Probe(dump_path, framework=_FMK[fmk], **probe_options)
            SingleSave._probes[key] = probe
        SingleSave._current = probe
        self.probe = probe

    @classmethod
    def _probe(cls) -> Probe:
        if cls._current is None:
            raise ProbeError("SingleSave: create one first, e.g. SingleSave('./dump_path', fmk='pytorch')")
        return cls._current

    @classmethod
    def save(cls, data: dict[str, Any]) -> None:
        cls._probe().save(data)

    @classmethod
    def save_config(cls, data: dict[str, Any]) -> None:
        cls._probe().save_config(data)

    @classmethod
    def step(cls) -> None:
        cls._probe().step()

    @classmethod
    def close(cls) -> None:
        """Close every SingleSave probe (also done at interpreter exit)."""
        for probe in cls._probes.values():
            probe.close()
        cls._probes.clear()
        cls._current = None


class SingleComparator:
    """msprobe's SingleComparator call shape: per-key `<key>.xlsx` files in `output_path`,
    with rlprobe's full comparison (report.xlsx, summary.json, key_data.parquet) beside them."""

    @classmethod
    def compare(cls, dir1: str, dir2: str, output_path: str = "./msprobe_compare_output",
                num_processes: int = 8) -> dict[str, Any]:
        from rlprobe.compare.run import compare

        return compare(dir1, dir2, output_path, workers=max(1, int(num_processes)), lang="zh",
                       per_key_files=True, per_key_dir=".")
