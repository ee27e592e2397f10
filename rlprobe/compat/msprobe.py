"""Drop-in replacements for msprobe 8.x entry points: change one import line to move over.

    from rlprobe.compat.msprobe import SingleSave     # was: from msprobe.core import SingleSave
    SingleSave("./dump_path", fmk="pytorch")
    SingleSave.save({"response": response})
    SingleSave.step()

Unlike msprobe, a second SingleSave(...) with another dump_path really switches to it.

msprobe 26.x removed grad_probe (GradComparator, the `grad_probe` task of PrecisionDebugger): this
module is where that API is maintained now (docs/compat.md).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, ClassVar

from rlprobe.capture.probe import Probe
from rlprobe.errors import ProbeError

_FMK = {"pytorch": "torch", "torch": "torch", "mindspore": "mindspore", "numpy": "numpy"}
# msprobe 8.1.2's words (single_saver.py) for data that is not a dict; it saves nothing then
NOT_A_DICT = "SingleSave data type not valid, should be dict. Skip current save process."
# msprobe's check_process_num: SingleComparator.compare's num_processes is an int in 1..128
MAX_PROCESSES = 128


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
        """Each key at its next micro-step of the step (msprobe: data/KEY/stepS/rankR/micro_stepM)."""
        probe = cls._probe()
        if not isinstance(data, dict):
            warnings.warn(NOT_A_DICT, RuntimeWarning, stacklevel=2)
            return
        probe.save(data)

    @classmethod
    def save_ex(cls, data: dict[str, Any], micro_batch: int | None = None) -> None:
        """msprobe's save_ex: the keys at micro-step `micro_batch` of the step, without counting them
        as save()'s next micro-step; None is msprobe's folder without micro_step<M> (data/KEY/stepS/
        rankR), read as micro-step 0. A key saved twice at one step and micro-step has two rows here
        (msprobe keeps the last file)."""
        probe = cls._probe()
        if not isinstance(data, dict):
            warnings.warn(NOT_A_DICT, RuntimeWarning, stacklevel=2)
            return
        probe.save(data, micro_step=0 if micro_batch is None else micro_batch)

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
        if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes <= 0:
            raise ValueError(f"process_num({num_processes}) is not a positive integer")  # msprobe's words
        if num_processes > MAX_PROCESSES:
            raise ValueError(f"The maximum supported process_num is {MAX_PROCESSES}, current value: {num_processes}.")
        from rlprobe.pipeline.compare_command import compare

        return compare(dir1, dir2, output_path, workers=num_processes, lang="zh",
                       per_key_files=True, per_key_dir=".")


class GradComparator:
    """msprobe's GradComparator call shape: msprobe's OUT/rank<R>/similarities.csv and
    OUT/rank<R>/similarities_picture/<param>_similarities.png (one monitor, as msprobe dumps
    have), and rlprobe's gradient comparison (grads.parquet, grad_steps.parquet, plots/) under OUT."""

    @classmethod
    def compare_distributed(cls, path1: str, path2: str, output: str) -> dict[str, Any]:
        import shutil

        import pyarrow.parquet as pq

        from rlprobe.pipeline.compare_command import compare
        from rlprobe.report.plots import EVERY_PARAM_DIR, write_grad_plots

        def msprobe_files(out: Path) -> None:  # written into the output folder before it is published
            write_grad_plots(out, every_param=True)
            for csv_file in (out / "grads").glob("**/similarities.csv"):  # msprobe puts rank<R>/ at the top
                target = out / csv_file.relative_to(out / "grads")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(csv_file, target)
            groups = sorted({(r["monitor"], r["rank"]) for r in
                             pq.read_table(out / "grad_steps.parquet", columns=["monitor", "rank"]).to_pylist()}) \
                if (out / "grad_steps.parquet").exists() else []
            if len({monitor for monitor, _ in groups}) == 1:  # msprobe's picture folders (several: plots/ only)
                for monitor, rank in groups:
                    suffix = "" if len(groups) == 1 else f"_{monitor}_rank{rank}"  # as write_grad_plots names it
                    folder = out / "plots" / f"{EVERY_PARAM_DIR}{suffix}"
                    if not folder.is_dir():  # no sign maps (L0): no similarities to draw
                        continue
                    pictures = out / f"rank{rank}" / "similarities_picture"
                    pictures.mkdir(parents=True, exist_ok=True)
                    for png in sorted(folder.glob("*.png")):
                        png.replace(pictures / f"{png.stem}_similarities.png")
                    folder.rmdir()

        return compare(path1, path2, output, reports=False, extra_files=msprobe_files)


class PrecisionDebugger:
    """msprobe's grad_probe PrecisionDebugger: PrecisionDebugger(config_json).monitor(model) for
    torch (a model, an optimizer, or both) or monitor(optimizer) for MindSpore; stop() closes."""

    def __init__(self, config_path: str, **probe_options: Any):
        import json

        try:
            config = json.loads(Path(config_path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ProbeError(f"PrecisionDebugger: cannot read config {config_path}: {e}") from None
        if config.get("task") != "grad_probe":
            raise ProbeError(f"PrecisionDebugger: {config_path} has task={config.get('task')!r}; "
                             "only 'grad_probe' is supported here (key data: use SingleSave)")
        if not config.get("dump_path"):
            raise ProbeError(f"PrecisionDebugger: {config_path} has no dump_path")
        grad = config.get("grad_probe") or {}
        self.options = {"level": grad.get("grad_level", "L1"), "bounds": grad.get("bounds") or None,
                        "params": grad.get("param_list") or None, "steps": config.get("step") or None,
                        "ranks": config.get("rank") or None}
        self.dump_path = config["dump_path"]
        self.probe_options = {"mode": "overwrite", **probe_options}
        self.probe: Probe | None = None

    def monitor(self, model: Any, optimizer: Any = None, name: str = "default") -> Any:
        if self.probe is None or self.probe.closed:
            self.probe = Probe(self.dump_path, **self.probe_options)
        # msprobe's MindSpore debugger takes the optimizer as `model`: monitor_grads accepts that too
        return self.probe.monitor_grads(model, optimizer=optimizer, name=name, **self.options)

    def step(self) -> None:
        if self.probe is not None:
            self.probe.step()

    def stop(self) -> None:
        if self.probe is not None:
            self.probe.close()
