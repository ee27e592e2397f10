"""PNG plots of `rlprobe check`: the histogram of Δ (rollout − trainer log-prob) per step, |Δ| by
response position, and the trends of mean/p99/max |Δ| over steps, one set per log-prob pair."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def write_check_plots(plots: Path, tables: dict[str, pa.Table]) -> list[Path]:
    from rlprobe.report.figures import new_figure, save

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
