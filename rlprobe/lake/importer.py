"""`rlprobe import-msprobe`: rewrite an msprobe SingleSave dump as an rlprobe dump."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from rlprobe.errors import DumpReadError, ProbeError
from rlprobe.lake.atomic import AtomicFolder, atomic_write_json
from rlprobe.lake.configs import read_json
from rlprobe.lake.encoding import narrow_integers
from rlprobe.lake.layout import FORMAT_VERSION, DumpLayout, key_data_call_dir, key_data_file_name
from rlprobe.lake.rank_writer import RankWriter
from rlprobe.lake.reader import open_dump
from rlprobe.lake.statistics import bitwise_hash, host_statistics
from rlprobe._version import __version__


def import_msprobe(src: str | Path, dst: str | Path) -> dict[str, int]:
    """Copy every tensor of `src` into a new rlprobe dump at `dst`, computing full statistics.

    msprobe stored every tensor as float32 without recording the original dtype, so the dtype
    column stays null (unknown) and the tensors stay as stored; nothing is guessed."""
    source = open_dump(src)
    if source.format != "msprobe":
        raise DumpReadError(f"{src} is not an msprobe SingleSave dump (found format {source.format!r})")
    target = DumpLayout(dst)
    if target.root.exists() and any(target.root.iterdir()):
        raise ProbeError(f"{dst} is not empty; import into a new directory")
    rows = source.arrow("key_data").to_pylist()
    ranks = sorted({r["rank"] for r in rows}) or [0]
    run_id = "msprobe-" + uuid.uuid4().hex[:8]
    target.root.mkdir(parents=True, exist_ok=True)
    atomic_write_json(target.run_manifest, {
        "format_version": FORMAT_VERSION, "run_id": run_id, "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "framework": "msprobe", "rlprobe_version": __version__, "world_size": len(ranks), "host": None,
        "imported_from": str(Path(src).resolve()), "tags": {},
    })
    config = Path(src) / "configurations.json"
    if config.exists():
        atomic_write_json(target.config_file(0), read_json(config))  # DumpReadError naming it where unreadable
    written = 0
    for rank in ranks:
        sink = RankWriter(target, rank, len(ranks), run_id, {"framework": "msprobe", "mode": "import"})
        mine = sorted((r for r in rows if r["rank"] == rank), key=lambda r: (r["step"], r["key"], r["micro_step"], r["index"]))
        for step in sorted({r["step"] for r in mine}):
            rows_of_step = [r for r in mine if r["step"] == step]
            # one folder per (step, micro_step), as a save call writes it: its (key, index) pairs are unique
            for call, micro_step in enumerate(sorted({r["micro_step"] for r in rows_of_step})):
                folder_path = key_data_call_dir(step, rank, call)
                folder = AtomicFolder(str(target.root / folder_path))
                added = []
                for r in (r for r in rows_of_step if r["micro_step"] == micro_step):
                    values = source.load_tensor(r["tensor_file"], None)
                    stats = host_statistics(values)
                    name = key_data_file_name(r["key"], r["index"])
                    sink.write_into(folder, name, narrow_integers(values, stats["min"], stats["max"]))
                    added.append({
                        "key": r["key"], "step": step, "micro_step": micro_step, "index": r["index"],
                        "dtype": None, "framework": "msprobe", "shape": list(values.shape), "numel": int(values.size),
                        **stats, "hash": bitwise_hash(values), "tensor_file": f"{folder_path}/{name}",
                    })
                try:
                    sink.commit_folder(folder)
                except OSError as e:
                    raise ProbeError(f"importing into {dst}: writing {folder.path}: {e}") from None
                for row in added:
                    sink.add_row("key_data", row)
                written += len(added)
            errors = sink.flush(step)
            if errors:
                raise ProbeError(f"importing into {dst}: {errors[0]}")
        errors = sink.close()
        if errors:
            raise ProbeError(f"importing into {dst}: {errors[0]}")
    return {"tensors": written, "ranks": len(ranks)}
