"""PNG plots of a key-data comparison: where (key x step) the runs differ, and how much."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow.parquet as pq

DIVERGED = ("mismatch", "shape_mismatch", "dtype_mismatch", "stats_only_mismatch", "error", "only_in_a", "only_in_b")


def write_key_data_plots(out: str | Path) -> list[Path]:
    """plots/key_data_heatmap.png and plots/key_data_max_rel_err.png from OUT/key_data.parquet."""
    import numpy as np
    from matplotlib.patches import Rectangle

    from rlprobe.report.figures import new_figure, save

    out = Path(out)
    rows = pq.read_table(out / "key_data.parquet", columns=["key", "step", "status", "max_rel_err",
                                                            "flow_position", "is_first_divergence"]).to_pylist()
    rows = [r for r in rows if r["step"] >= 0]
    plots = out / "plots"
    plots.mkdir(exist_ok=True)
    if not rows:
        return []
    keys = sorted({r["key"] for r in rows}, key=lambda k: min(r["flow_position"] for r in rows if r["key"] == k))
    steps = sorted({r["step"] for r in rows})
    grid = np.full((len(keys), len(steps)), np.nan)
    for r in rows:
        i, j = keys.index(r["key"]), steps.index(r["step"])
        err = r["max_rel_err"]
        value = -8.0 if r["status"] in ("match", "stats_only_match") else (
            math.log10(max(err, 1e-8)) if err is not None and math.isfinite(err) else 1.0)
        grid[i, j] = value if np.isnan(grid[i, j]) else max(grid[i, j], value)

    written = []
    fig, ax = new_figure((max(6, 0.5 * len(steps) + 3), max(3, 0.4 * len(keys) + 1.5)))
    image = ax.imshow(grid, aspect="auto", cmap="magma_r", vmin=-8, vmax=1, interpolation="nearest")
    ax.set_yticks(range(len(keys)), keys)
    ax.set_xticks(range(len(steps)), [str(s) for s in steps], rotation=90 if len(steps) > 20 else 0)
    ax.set_xlabel("step")
    ax.set_title("max relative error per key and step (log10; -8 = identical)")
    for r in rows:
        if r["is_first_divergence"]:
            ax.add_patch(Rectangle((steps.index(r["step"]) - 0.5, keys.index(r["key"]) - 0.5), 1, 1,
                                   fill=False, edgecolor="cyan", linewidth=2.5))
    fig.colorbar(image, ax=ax, label="log10 max rel err")
    written.append(save(fig, plots / "key_data_heatmap.png"))

    fig, ax = new_figure((8, 4.5))
    for k in keys:
        ys = [max((r["max_rel_err"] or 0.0) for r in rows if r["key"] == k and r["step"] == s) if any(
            r["key"] == k and r["step"] == s for r in rows) else np.nan for s in steps]
        if any(y and y > 0 for y in ys if y == y):
            ax.plot(steps, [max(y, 1e-12) if y == y else np.nan for y in ys], marker="o", label=k)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("max relative error")
    ax.set_title("max relative error by step (keys that differ)")
    ax.grid(True, which="both", alpha=0.3)
    if ax.lines:
        ax.legend(fontsize="small", ncol=2)
    written.append(save(fig, plots / "key_data_max_rel_err.png"))
    return written
