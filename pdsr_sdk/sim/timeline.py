"""PNG timeline of a simulation: engines (rows) x virtual time, colour = running sequences.

matplotlib is imported only when a timeline is drawn, and only its Agg canvas is used (no pyplot backend is
chosen or switched: a caller's own figures and backend, a notebook's, stay as they were).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


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


def write_timeline(report, path: str | Path, *, bins: int = 600) -> Path:
    """Draw one panel per policy (shared time axis) and save it as a PNG."""
    runs = report.runs
    panels = [(run.engines, run.makespan_s, [b.start_s for b in run.batches[1:]],
               f"{run.policy}: makespan {run.makespan_s:.4g} s, bound {run.lower_bound_s:.4g} s "
               f"(fast above the line, heavy below; dotted = batch starts)") for run in runs]
    return _draw(panels, path, vmax=max((e.max_concurrency for r in runs for e in r.engines), default=1), bins=bins)


def write_steps_timeline(report, path: str | Path, *, bins: int = 600) -> Path:
    """Draw one panel per over-provision value of a multi-step run (:class:`~pdsr_sdk.sim.steps_report.StepsReport`;
    its engines must have recorded their occupancy; after a search, the pick's alone: ``timeline_runs``) and
    save it as a PNG: where the steps' slots sat empty, and which engines the policy kept light (its tail lane)."""
    panels = []
    runs = report.timeline_runs()
    for run in runs:
        lanes = ", ".join(e.name for e in run.engines if e.lane)
        panels.append((run.engines, run.horizon_s, [s.end_s for s in run.steps[:-1]],
                       f"{run.policy}, F={run.over_provision:g}: steady step {run.steady_step_s:.4g} s "
                       f"(on-policy {report.baseline_step_s:.4g} s); dotted = step ends"
                       + (f"; tail lane: {lanes}" if lanes else "")))
    return _draw(panels, path, vmax=max((e.max_seqs for r in runs for e in r.engines), default=1), bins=bins)


def _draw(panels, path: str | Path, *, vmax: int, bins: int) -> Path:
    """``panels``: one (engines, end, marks, title) each, drawn on a shared time axis: engines (each with
    ``name``, ``pool``, ``occupancy_t`` and ``occupancy_n``) as rows coloured by running sequences up to
    ``vmax``, blank after ``end``, a dotted line at each time of ``marks``."""
    horizon = max((end for _, end, _, _ in panels), default=0.0) or 1.0
    edges = np.linspace(0.0, horizon, bins + 1)
    n_eng = len(panels[0][0]) if panels else 0
    height = min(2.2 + 0.012 * n_eng, 7.0)
    fig = agg_figure((11, 0.6 + height * len(panels)))
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)
    image = None
    for ax, (engines, end, marks, title) in zip(axes[:, 0], panels):
        grid = np.stack([occupancy_grid(e.occupancy_t, e.occupancy_n, edges) for e in engines])
        # time past this panel's own end is blank
        grid[:, edges[:-1] >= end] = np.nan
        image = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0, vmax=vmax,
                          extent=(0.0, horizon, len(engines) - 0.5, -0.5))
        n_fast = sum(1 for e in engines if e.pool == "fast")
        if 0 < n_fast < len(engines):
            ax.axhline(n_fast - 0.5, color="white", lw=1.0)
        for t in marks:
            ax.axvline(t, color="white", lw=0.6, ls=":")
        ax.set_ylabel("engine")
        ax.set_title(title, fontsize=9)
        if len(engines) <= 16:
            ax.set_yticks(range(len(engines)), [e.name for e in engines], fontsize=7)
    axes[-1, 0].set_xlabel("virtual time (s)")
    if image is not None:
        fig.colorbar(image, ax=axes[:, 0].tolist(), label="running sequences", shrink=0.8)
    from pdsr_sdk.io.tables import write_png

    write_png(fig, path)
    return Path(path)
