"""PNG plots of a key-data comparison: where (key x step) the runs differ, and how much.

Figures are drawn through matplotlib's object API (new_figure, save), not pyplot: no global backend switch in
the caller's process (a notebook keeps its own), no figure registry to close, and ~0.15 s less import time than
matplotlib.pyplot. `rlprobe check`'s plots are here too (write_check_plots): the histogram of Δ (rollout −
trainer log-prob) per step, |Δ| by response position, and the trends of mean/p99/max |Δ| over steps, one set
per log-prob pair.

And the plots of a gradient comparison (write_grad_plots; OUT/grads.parquet, OUT/grad_steps.parquet): the
weighted similarity per step with flagged steps marked, the ten worst parameters, and on request one plot per
parameter. Rows are grouped with Arrow, not Python loops: a run of 300 parameters x 1,000 steps x 8 ranks has
2.4M rows.
"""

from __future__ import annotations

import math
import re
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

DIVERGED = ("mismatch", "shape_mismatch", "dtype_mismatch", "stats_only_mismatch", "error", "only_in_a", "only_in_b",
            "absent_in_a", "absent_in_b")


def write_plots(out: str | Path, every_param: bool = False) -> list[Path]:
    """Every PNG of the comparison in OUT (plots/): the key data's, and the gradients' where they
    were compared (with `every_param` one per parameter too). `rlprobe compare --plots` and
    pipelines with `report.plots` call this."""
    return write_key_data_plots(out) + write_grad_plots(out, every_param=every_param)


def write_key_data_plots(out: str | Path) -> list[Path]:
    """plots/key_data_heatmap.png and plots/key_data_max_rel_err.png from OUT/key_data.parquet.
    The key x step grids are filled with numpy from Arrow columns (a long run has millions of rows)."""
    from matplotlib.patches import Rectangle

    out = Path(out)
    table = pq.read_table(out / "key_data.parquet", columns=["key", "step", "status", "max_rel_err",
                                                             "flow_position", "is_first_divergence"])
    table = table.filter(pc.greater_equal(table["step"], 0))
    plots = out / "plots"
    plots.mkdir(exist_ok=True)
    if not table.num_rows:
        return []
    keys, steps, grid, worst, first = key_step_grids(table)
    written = []
    # half an inch a step up to 16 inches (1,000 steps made a 60,000-pixel image); then ~40 labels
    fig, ax = new_figure((min(max(6, 0.5 * len(steps) + 3), 16), min(max(3, 0.4 * len(keys) + 1.5), 12)))
    image = ax.imshow(grid, aspect="auto", cmap="magma_r", vmin=-8, vmax=1, interpolation="nearest")
    ax.set_yticks(range(len(keys)), keys)
    shown = range(0, len(steps), max(1, math.ceil(len(steps) / 40)))
    ax.set_xticks(list(shown), [str(steps[i]) for i in shown], rotation=90 if len(shown) > 20 else 0)
    ax.set_xlabel("step")
    ax.set_title("max relative error per key and step (log10; -8 = identical)")
    for i, j in first:
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="cyan", linewidth=2.5))
    fig.colorbar(image, ax=ax, label="log10 max rel err")
    written.append(save(fig, plots / "key_data_heatmap.png"))

    fig, ax = new_figure((8, 4.5))
    for k, ys in zip(keys, worst):
        if np.any(ys > 0):
            ax.plot(steps, np.maximum(ys, 1e-12), marker="o", label=k)  # NaN (no row) stays a gap
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("max relative error")
    ax.set_title("max relative error by step (keys that differ)")
    ax.grid(True, which="both", alpha=0.3)
    if ax.lines:
        ax.legend(fontsize="small", ncol=2)
    written.append(save(fig, plots / "key_data_max_rel_err.png"))
    return written


def key_step_grids(table: pa.Table) -> tuple[list[str], list[int], np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """From key_data rows (key, step, status, max_rel_err, flow_position, is_first_divergence):
    the keys in flow order, the steps, the heat map grid (key x step: the worst row's log10 max
    relative error, -8 for a match, 1 for an error that is missing or not finite, NaN without a
    row), the largest max_rel_err per cell (0 for rows without one, NaN without a row) and the
    (key, step) cells of the first divergence. Filled with numpy from Arrow columns: a long run
    has millions of rows."""
    order = table.group_by("key").aggregate([("flow_position", "min")]).sort_by(
        [("flow_position_min", "ascending"), ("key", "ascending")])
    keys = order["key"].to_pylist()
    steps = pc.unique(table["step"]).sort().to_pylist()
    row_key = pc.index_in(table["key"], value_set=pa.array(keys, table["key"].type)).to_numpy()
    row_step = pc.index_in(table["step"], value_set=pa.array(steps, table["step"].type)).to_numpy()
    err = table["max_rel_err"].to_numpy()  # nulls read as NaN
    matching = pa.array(["match", "stats_only_match", "close", "stats_only_close", "absent_in_both"])
    match = pc.is_in(table["status"], matching).to_numpy(zero_copy_only=False)
    with np.errstate(invalid="ignore", divide="ignore"):
        value = np.where(match, -8.0, np.where(np.isfinite(err), np.log10(np.maximum(err, 1e-8)), 1.0))
    grid = np.full((len(keys), len(steps)), np.nan)
    np.fmax.at(grid, (row_key, row_step), value)
    worst = np.full((len(keys), len(steps)), np.nan)
    np.fmax.at(worst, (row_key, row_step),
               np.where(table["max_rel_err"].is_null().to_numpy(zero_copy_only=False), 0.0, err))
    marked = np.flatnonzero(pc.fill_null(table["is_first_divergence"], False).to_numpy(zero_copy_only=False))
    return keys, steps, grid, worst, [(int(row_key[i]), int(row_step[i])) for i in marked]


def new_figure(figsize: tuple[float, float]) -> tuple[Any, Any]:
    """(figure, axes) of one subplot, drawn with the Agg renderer."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def save(fig: Any, path: Path, dpi: int = 120) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    return path


def write_check_plots(plots: Path, tables: dict[str, pa.Table]) -> list[Path]:
    steps = tables.get("token_steps")
    if steps is None or steps.num_rows == 0:
        return []
    plots.mkdir(exist_ok=True)
    written = []
    for pair in sorted(set(steps["pair"].to_pylist())):
        mine = steps.filter(pc.equal(steps["pair"], pair))
        by_step: dict[int, dict[str, list[float]]] = {}
        for r in mine.to_pylist():
            slot = by_step.setdefault(r["step"], {"mean_abs": [], "p99_abs": [], "max_abs": []})
            for k in slot:
                slot[k].append(r[k] if r[k] is not None else np.nan)
        fig, ax = new_figure((7, 4))
        xs = sorted(by_step)
        for k in ("mean_abs", "p99_abs", "max_abs"):
            ax.plot(xs, [np.nanmax(by_step[s][k]) for s in xs], marker="o", label=k.replace("_abs", " |Δ|"))
        ax.set_yscale("symlog", linthresh=1e-7)
        ax.set_xlabel("step")
        ax.set_ylabel("|Δ| (nats), worst rank")
        ax.set_title(f"{pair}: trend over steps")
        ax.legend()
        written.append(save(fig, plots / f"{pair}_trend.png"))
        written += _hist(plots, pair, tables["token_hist"], new_figure, save)
        written += _positions(plots, pair, tables["token_positions"], new_figure, save)
    return written


def _hist(plots: Path, pair: str, hist: pa.Table, new_figure, save) -> list[Path]:
    mine = hist.filter(pc.equal(hist["pair"], pair))
    if mine.num_rows == 0:
        return []
    fig, ax = new_figure((7, 4))
    for step in sorted(set(mine["step"].to_pylist()))[:12]:
        rows = mine.filter(pc.equal(mine["step"], step)).to_pydict()
        order = np.argsort(rows["lo"])
        centre = (np.asarray(rows["lo"]) + np.asarray(rows["hi"]))[order] / 2
        counts = np.asarray(rows["tokens"], dtype=float)[order]
        ax.plot(centre, counts, drawstyle="steps-mid", label=f"step {step}")
    ax.set_xscale("symlog", linthresh=1e-6)
    ax.set_xlabel("Δ (nats)")
    ax.set_ylabel("tokens")
    ax.set_title(f"{pair}: histogram of Δ per step")
    ax.legend(fontsize="small")
    return [save(fig, plots / f"{pair}_delta_hist.png")]


def _positions(plots: Path, pair: str, positions: pa.Table, new_figure, save) -> list[Path]:
    mine = positions.filter(pc.equal(positions["pair"], pair))
    if mine.num_rows == 0:
        return []
    fig, ax = new_figure((7, 4))
    for step in sorted(set(mine["step"].to_pylist()))[:12]:
        rows = mine.filter(pc.equal(mine["step"], step)).to_pydict()
        totals: dict[float, list[float]] = {}
        for lo, n, mean in zip(rows["lo"], rows["tokens"], rows["mean_abs"]):
            t = totals.setdefault(lo, [0.0, 0.0])
            t[0] += n
            t[1] += n * mean
        xs = sorted(totals)
        ax.plot([x + 1 for x in xs], [totals[x][1] / totals[x][0] for x in xs], marker="o", label=f"step {step}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("response position + 1 (bucket start)")
    ax.set_ylabel("mean |Δ| (nats)")
    ax.set_title(f"{pair}: |Δ| by token position")
    ax.legend(fontsize="small")
    return [save(fig, plots / f"{pair}_by_position.png")]


EVERY_PARAM_DIR = "grad_params"


def write_grad_plots(out: str | Path, worst: int = 10, every_param: bool = False) -> list[Path]:
    """plots/grad_similarity[_<monitor>_rank<R>].png and plots/grad_worst_params[...].png (the
    `worst` parameters with the lowest similarity); with `every_param` also
    plots/grad_params[_<monitor>_rank<R>]/<param>.png for every parameter compared. Nothing when
    OUT holds no gradient comparison."""
    out = Path(out)
    if not (out / "grad_steps.parquet").exists():
        return []
    if type(worst) is not int or worst < 1:
        raise ValueError(f"worst must be a whole number >= 1, not {worst!r}")
    steps = pq.read_table(out / "grad_steps.parquet", columns=["monitor", "rank", "step", "weighted_similarity",
                                                                "flagged"])
    params = pq.read_table(out / "grads.parquet", columns=["monitor", "rank", "step", "param", "similarity"])
    params = params.filter(pc.is_valid(params["similarity"]))
    groups = sorted({(r["monitor"], r["rank"]) for r in steps.select(["monitor", "rank"]).to_pylist()})
    plots = out / "plots"
    plots.mkdir(exist_ok=True)
    written: list[Path] = []
    for monitor, rank in groups:
        suffix = "" if len(groups) == 1 else f"_{monitor}_rank{rank}"
        mine = steps.filter(pc.and_(_group_mask(steps, monitor, rank), pc.is_valid(steps["weighted_similarity"])))
        rows = mine.sort_by("step").to_pylist()
        bad = [r["step"] for r in rows if r["flagged"]]
        written.append(_similarity_plot(rows, bad, monitor, rank, plots / f"grad_similarity{suffix}.png"))
        series = _series_by_param(params.filter(_group_mask(params, monitor, rank)))
        if not series:
            continue
        lowest = sorted(series, key=lambda p: (float(series[p][1].min()), p))[:worst]
        written.append(_worst_plot({p: series[p] for p in lowest}, bad, monitor, rank,
                                   plots / f"grad_worst_params{suffix}.png"))
        if every_param:
            written += _every_param_plots(series, bad, monitor, rank, plots / f"{EVERY_PARAM_DIR}{suffix}")
    return written


def _group_mask(table: pa.Table, monitor: str, rank: int) -> pa.ChunkedArray:
    return pc.and_(pc.equal(table["monitor"], monitor), pc.equal(table["rank"], rank))


def _series_by_param(table: pa.Table) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """param -> (steps, similarities) in step order, from one sort and one split."""
    if not table.num_rows:
        return {}
    table = table.sort_by([("param", "ascending"), ("step", "ascending")])
    encoded = pc.dictionary_encode(table["param"]).combine_chunks()
    codes = encoded.indices.to_numpy()
    names = encoded.dictionary.to_pylist()
    step = table["step"].to_numpy()
    similarity = table["similarity"].to_numpy()
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    ends = np.r_[starts[1:], len(codes)]
    return {names[codes[a]]: (step[a:b], similarity[a:b]) for a, b in zip(starts, ends)}


def _axes_labels(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("optimizer step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("share of agreeing gradient signs")
    ax.grid(True, alpha=0.3)


def _similarity_plot(rows: list[dict], bad: list[int], monitor: str, rank: int, path: Path) -> Path:
    fig, ax = new_figure((8, 4.5))
    ax.plot([r["step"] for r in rows], [r["weighted_similarity"] for r in rows], marker="o",
            label="weighted similarity")
    if bad:
        flagged = [r for r in rows if r["flagged"]]
        ax.scatter([r["step"] for r in flagged], [r["weighted_similarity"] for r in flagged], s=120,
                   facecolors="none", edgecolors="red", linewidths=2, label="flagged step", zorder=3)
    _axes_labels(ax)
    ax.set_title(f"gradient sign similarity, monitor {monitor!r}, rank {rank}")
    ax.set_ylim(min([0.5] + [r["weighted_similarity"] - 0.02 for r in rows]), 1.01)
    ax.legend(loc="lower left")
    return save(fig, path)


def _worst_plot(series: dict[str, tuple[np.ndarray, np.ndarray]], bad: list[int], monitor: str, rank: int,
                path: Path) -> Path:
    fig, ax = new_figure((9, 5))
    for param, (xs, ys) in series.items():
        ax.plot(xs, ys, marker=".", label=param)
    for step in bad:
        ax.axvline(step, color="red", alpha=0.15, linewidth=6)
    _axes_labels(ax)
    ax.set_title(f"the {len(series)} parameters with the lowest sign similarity\n"
                 f"monitor {monitor!r}, rank {rank}; red: flagged steps")
    ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    return save(fig, path)


def _every_param_plots(series: dict[str, tuple[np.ndarray, np.ndarray]], bad: list[int], monitor: str, rank: int,
                       folder: Path) -> list[Path]:
    """One PNG per parameter, blitted: the axes, ticks, grid and flagged steps are drawn once per
    y range (0.5-1 or, for parameters that fall below 0.52, 0-1) and kept as pixels; each
    parameter then draws only its line and title on a copy (a full figure per parameter spent
    ~35 ms laying out and drawing the same text)."""
    folder.mkdir(exist_ok=True)
    fig, ax = new_figure((8, 4.5))
    fig.set_dpi(100)
    fig.subplots_adjust(left=0.1, right=0.97, top=0.9, bottom=0.12)  # fixed: every title and tick fits
    for step in bad:
        ax.axvline(step, color="red", alpha=0.15, linewidth=6)
    _axes_labels(ax)
    if bad:
        ax.set_xlabel("optimizer step (red: flagged steps)")
    first = min(int(xs[0]) for xs, _ in series.values())
    last = max(int(xs[-1]) for xs, _ in series.values())
    ax.set_xlim(first - 0.5, last + 0.5)
    (line,) = ax.plot([], [], marker=".", animated=True)  # animated: left out of the background
    ax.title.set_animated(True)
    ax.title.set_fontsize("medium")
    canvas = fig.canvas
    backgrounds = {}
    written, used = [], set()
    # PNG encoding releases the GIL: two threads encode while this one draws the next parameters
    # (at most 4 images of ~1 MB wait for them)
    with ThreadPoolExecutor(max_workers=2) as encoder:
        encoded: deque = deque()
        for param, (xs, ys) in series.items():
            low = 0.5 if float(ys.min()) >= 0.52 else 0.0
            ax.set_ylim(low, 1.01)
            if low not in backgrounds:
                canvas.draw()
                backgrounds[low] = canvas.copy_from_bbox(fig.bbox)
            canvas.restore_region(backgrounds[low])
            line.set_data(xs, ys)
            ax.title.set_text(f"{param}  (monitor {monitor!r}, rank {rank})")
            ax.draw_artist(line)
            ax.draw_artist(ax.title)
            path = folder / f"{_file_name(param, used)}.png"
            # a copy (the canvas is drawn again), RGB: the figure is opaque and a quarter less to encode
            pixels = np.ascontiguousarray(np.asarray(canvas.buffer_rgba())[:, :, :3])
            encoded.append(encoder.submit(_write_png, path, pixels))
            written.append(path)
            if len(encoded) > 4:
                encoded.popleft().result()  # an error writing a file is raised here
        for job in encoded:
            job.result()
    return written


def _write_png(path: Path, pixels: np.ndarray) -> None:
    from PIL import Image  # matplotlib's own PNG writer; imsave would add an alpha channel back

    # zlib level 1: a third less time than the default 6, for ~10% more bytes
    Image.fromarray(pixels).save(path, format="PNG", compress_level=1)


def _file_name(param: str, used: set[str]) -> str:
    """`param` as a file name: characters other than letters, digits, '.', '_' and '-' become '_';
    a name taken already (case-insensitively, for such file systems) gets '~2', '~3', ..."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", param).strip(".") or "param"
    name, n = base, 1
    while name.lower() in used:
        n += 1
        name = f"{base}~{n}"
    used.add(name.lower())
    return name
