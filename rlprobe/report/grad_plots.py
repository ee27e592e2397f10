"""PNG plots of a gradient comparison (OUT/grads.parquet, OUT/grad_steps.parquet): the weighted
similarity per step with flagged steps marked, and the ten worst parameters (or all of them)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq


def write_grad_plots(out: str | Path, worst: int | None = 10) -> list[Path]:
    """plots/grad_similarity[_<monitor>_rank<R>].png and plots/grad_worst_params[...].png;
    `worst=None` plots every parameter. Nothing when OUT holds no gradient comparison."""
    out = Path(out)
    if not (out / "grad_steps.parquet").exists():
        return []
    from matplotlib.ticker import MaxNLocator

    from rlprobe.report.figures import new_figure, save

    steps = pq.read_table(out / "grad_steps.parquet").to_pylist()
    params = pq.read_table(out / "grads.parquet", columns=["monitor", "rank", "step", "param", "similarity"]).to_pylist()
    groups = sorted({(r["monitor"], r["rank"]) for r in steps})
    plots = out / "plots"
    plots.mkdir(exist_ok=True)
    written: list[Path] = []
    for monitor, rank in groups:
        suffix = "" if len(groups) == 1 else f"_{monitor}_rank{rank}"
        rows = [r for r in steps if (r["monitor"], r["rank"]) == (monitor, rank) and r["weighted_similarity"] is not None]
        fig, ax = new_figure((8, 4.5))
        xs = [r["step"] for r in rows]
        ax.plot(xs, [r["weighted_similarity"] for r in rows], marker="o", label="weighted similarity")
        bad = [r for r in rows if r["flagged"]]
        if bad:
            ax.scatter([r["step"] for r in bad], [r["weighted_similarity"] for r in bad], s=120, facecolors="none",
                       edgecolors="red", linewidths=2, label="flagged step", zorder=3)
        ax.set_xlabel("optimizer step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("share of agreeing gradient signs")
        ax.set_title(f"gradient sign similarity, monitor {monitor!r}, rank {rank}")
        ax.set_ylim(min([0.5] + [r["weighted_similarity"] - 0.02 for r in rows]), 1.01)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower left")
        written.append(save(fig, plots / f"grad_similarity{suffix}.png"))

        mine = [r for r in params if (r["monitor"], r["rank"]) == (monitor, rank) and r["similarity"] is not None]
        lowest: dict[str, float] = {}
        for r in mine:
            lowest[r["param"]] = min(lowest.get(r["param"], 2.0), r["similarity"])
        chosen = sorted(lowest, key=lambda p: (lowest[p], p))[:worst] if worst else sorted(lowest)
        if not chosen:
            continue
        fig, ax = new_figure((9, 5))
        for p in chosen:
            pts = sorted((r["step"], r["similarity"]) for r in mine if r["param"] == p)
            ax.plot([s for s, _ in pts], [v for _, v in pts], marker=".", label=p)
        for r in bad:
            ax.axvline(r["step"], color="red", alpha=0.15, linewidth=6)
        ax.set_xlabel("optimizer step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("share of agreeing gradient signs")
        what = f"the {len(chosen)} lowest" if worst else "all"
        ax.set_title(f"{what} parameters by similarity, monitor {monitor!r}, rank {rank} (red: flagged steps)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
        name = f"grad_worst_params{suffix}.png" if worst else f"grad_all_params{suffix}.png"
        written.append(save(fig, plots / name))
    return written
