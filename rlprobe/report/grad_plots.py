"""PNG plots of a gradient comparison (OUT/grads.parquet, OUT/grad_steps.parquet): the weighted
similarity per step with flagged steps marked, the ten worst parameters, and on request one plot
per parameter. Rows are grouped with Arrow, not Python loops: a run of 300 parameters x 1,000
steps x 8 ranks has 2.4M rows."""

from __future__ import annotations

import re
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

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
    from rlprobe.report.figures import new_figure, save

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
    from rlprobe.report.figures import new_figure, save

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
    from rlprobe.report.figures import new_figure

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
