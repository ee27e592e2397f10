"""What a comparison's or pipeline's output folder holds, for `rlprobe info OUT`: the runs compared,
the first divergence and verdict, the status counts, the gates, and each table with its row count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlprobe.errors import DumpReadError
from rlprobe.pipeline.catalog import result_views


def result_info(root: Path) -> dict[str, Any]:
    """The summary of the result folder `root` (is_result_dir); DumpReadError names a file that cannot be read."""
    import pyarrow.parquet as pq

    try:
        summary = json.loads((root / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DumpReadError(f"{root / 'summary.json'}: unreadable ({e})") from None
    if not isinstance(summary, dict):
        raise DumpReadError(f"{root / 'summary.json'}: not a JSON object")
    tables = []
    for view, f in result_views(root):
        try:
            rows = pq.ParquetFile(f).metadata.num_rows
        except Exception as e:  # pyarrow's OSError or ArrowException: a corrupt file
            raise DumpReadError(f"{f}: unreadable Parquet file ({' '.join(str(e).split())})") from None
        tables.append({"table": view, "file": f.relative_to(root).as_posix(), "rows": rows})
    pipeline = summary.get("pipeline") or {}
    return {
        "path": str(root),
        "kind": "comparison",
        "pipeline": pipeline.get("name"),
        "rlprobe_version": summary.get("rlprobe_version"),
        "created_at": summary.get("created_at"),
        "runs": {side: {"path": summary.get(f"run_{side}"), "format": summary.get(f"format_{side}")}
                 for side in ("a", "b") if summary.get(f"run_{side}")},
        "compared": summary.get("compared"),
        "first_divergence": summary.get("first_divergence"),
        "suspect": summary.get("suspect"),
        "advice": summary.get("advice"),
        "counts": summary.get("counts") or {},
        "gates": [{"name": g.get("name"), "passed": g.get("passed"), "rows": g.get("rows")}
                  for g in summary.get("gates") or []],
        "tables": tables,
    }
