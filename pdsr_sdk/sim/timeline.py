"""PNG timeline of a simulation: engines (rows) x virtual time, colour = running sequences.

matplotlib is imported only when a timeline is drawn, and only its Agg canvas is used (no pyplot backend is
chosen or switched: a caller's own figures and backend, a notebook's, stay as they were).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pdsr_sdk.errors import ConfigValueError


def agg_figure(size: tuple[float, float]):
    """A figure drawn on matplotlib's Agg canvas, outside pyplot (headless, and nothing global changes)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    FigureCanvasAgg(fig)
    return fig


def occupancy_grid(times: list[float], counts: list[int], edges: np.ndarray) -> np.ndarray:
    """Time-weighted mean of a step function (``counts[k]`` from ``times[k]`` on) over each bin of ``edges``."""
    t = np.asarray(times, dtype=np.float64)
    n = np.asarray(counts, dtype=np.float64)
    # integral of the step function at each change point, then at the bin edges
    cum = np.concatenate([[0.0], np.cumsum(n[:-1] * np.diff(t))])
    k = np.clip(np.searchsorted(t, edges, side="right") - 1, 0, len(t) - 1)
    at = cum[k] + n[k] * np.maximum(edges - t[k], 0.0)
    width = np.diff(edges)
    return np.diff(at) / np.where(width > 0, width, 1.0)


#: time-weighted running sequences below this read as idle (float sums of zero are exact; the margin is cheap)
IDLE_BELOW = 1e-9
IDLE_COLOUR = "#c8c8c8"   # idle engine time: grey, apart from every running count on the colour scale
MARK_COLOUR = "tab:red"   # batch starts / step ends: red shows on viridis and on the idle grey alike


def write_timeline(report, path: str | Path, *, bins: int = 600) -> Path:
    """Draw one panel per policy (shared time axis) and save it as a PNG."""
    runs = report.runs
    panels = [(run.engines, run.makespan_s, [b.start_s for b in run.batches[1:]],
               f"{run.policy}: makespan {run.makespan_s:.4g} s, bound {run.lower_bound_s:.4g} s") for run in runs]
    vmax = max((e.max_concurrency for r in runs for e in r.engines), default=1)
    return _draw(panels, path, vmax=vmax, bins=bins, marks="batch starts")


def write_steps_timeline(report, path: str | Path, *, bins: int = 600) -> Path:
    """Draw one panel per over-provision value of a multi-step run (:class:`~pdsr_sdk.sim.steps_report.StepsReport`;
    its engines must have recorded their occupancy; after a search, the pick's alone: ``timeline_runs``) and
    save it as a PNG: where the steps' slots sat empty, and which engines the policy kept light (its tail lane)."""
    panels = []
    runs = report.timeline_runs()
    auto = report.cfg.update == "auto"   # runs of both updates: each panel names its own
    for run in runs:
        lanes = ", ".join(e.name for e in run.engines if e.lane)
        panels.append((run.engines, run.horizon_s, [s.end_s for s in run.steps[:-1]],
                       f"{run.policy}, F={run.over_provision:g}" + (f", update {run.update}" if auto else "")
                       + f": steady step {run.steady_step_s:.4g} s "
                       f"(on-policy {report.baseline_step_s:.4g} s)" + (f"; tail lane: {lanes}" if lanes else "")))
    vmax = max((e.max_seqs for r in runs for e in r.engines), default=1)
    return _draw(panels, path, vmax=vmax, bins=bins, marks="step ends")


def timeline_image(grid: np.ndarray) -> np.ndarray:
    """What the timeline's image holds for a grid of mean running sequences: log10 of the count (a bin with any
    running, however briefly, counts at least 1), -1 where the engine sat idle (below the colour scale: grey), NaN
    kept (past the panel's end: blank). On a log scale an engine running the long tail's last few sequences reads
    apart from one running hundreds, and apart from an idle one."""
    out = np.log10(np.maximum(grid, 1.0))
    out[grid < IDLE_BELOW] = -1.0
    out[np.isnan(grid)] = np.nan
    return out


def _draw(panels, path: str | Path, *, vmax: int, bins: int, marks: str) -> Path:
    """``panels``: one (engines, end, mark times, title) each, drawn on a shared time axis: engines (each with
    ``name``, ``pool``, ``occupancy_t`` and ``occupancy_n``) as rows coloured by running sequences (log scale, 1 to
    ``vmax``; grey = idle), blank after ``end``, a dashed line at each mark time (``marks`` names them)."""
    import matplotlib
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import LogNorm, Normalize

    for engines, end, _, title in panels:
        # a run that was not recorded reads as engines idle throughout: refuse it rather than draw that
        if end > 0 and not any(max(e.occupancy_n, default=0) > 0 for e in engines):
            raise ConfigValueError(f"timeline: {title.split(':')[0]} recorded no engine occupancy; simulate with "
                                   "timeline=True (with steps, and out_dir set) to draw its timeline")
    horizon = max((end for _, end, _, _ in panels), default=0.0) or 1.0
    edges = np.linspace(0.0, horizon, bins + 1)
    n_eng = len(panels[0][0]) if panels else 0
    height = min(2.2 + 0.012 * n_eng, 7.0)
    fig_height = 0.9 + height * len(panels)
    fig = agg_figure((11, fig_height))
    # the figure title sits a fixed height above the panels' titles, however many panels there are
    fig.subplots_adjust(top=1.0 - 0.65 / fig_height)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)
    cmap = matplotlib.colormaps["viridis"].with_extremes(under=IDLE_COLOUR, bad="white")
    top = np.log10(max(vmax, 2))
    pools = False
    for ax, (engines, end, times, title) in zip(axes[:, 0], panels):
        grid = np.stack([occupancy_grid(e.occupancy_t, e.occupancy_n, edges) for e in engines])
        # time past this panel's own end is blank
        grid[:, edges[:-1] >= end] = np.nan
        ax.imshow(timeline_image(grid), aspect="auto", interpolation="nearest", cmap=cmap,
                  norm=Normalize(vmin=0.0, vmax=top), extent=(0.0, horizon, len(engines) - 0.5, -0.5))
        n_fast = sum(1 for e in engines if e.pool == "fast")
        if 0 < n_fast < len(engines):
            pools = True
            ax.axhline(n_fast - 0.5, color="black", lw=1.2)
        for t in times:
            ax.axvline(t, color=MARK_COLOUR, lw=1.3, ls=(0, (4, 2)))
        ax.set_ylabel("engine")
        ax.set_title(title, fontsize=9)
        if len(engines) <= 16:
            ax.set_yticks(range(len(engines)), [e.name for e in engines], fontsize=7)
    axes[-1, 0].set_xlabel("virtual time (s)")
    fig.suptitle("Running sequences per engine over virtual time: grey = idle, "
                 f"red dashed = {marks}" + ("; fast pool above the black line, heavy below" if pools else ""),
                 fontsize=10, y=1.0 - 0.1 / fig_height, va="top")
    # the colour bar is drawn from a log norm over the same counts, so its ticks read 1, 10, 100
    scale = ScalarMappable(norm=LogNorm(vmin=1, vmax=max(vmax, 2)), cmap=cmap)
    # at most about 5 in long: beside eight policies' panels a 0.8 share of the height was 15 in of bar
    bar = fig.colorbar(scale, ax=axes[:, 0].tolist(), label="running sequences (log scale)",
                       shrink=min(0.8, 5.0 / fig_height), extend="min")
    ticks = [t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000) if t <= vmax]
    bar.set_ticks(ticks, labels=[str(t) for t in ticks])
    bar.ax.minorticks_off()
    from pdsr_sdk.io.tables import write_png

    write_png(fig, path)
    return Path(path)
