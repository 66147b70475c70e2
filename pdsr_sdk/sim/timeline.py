"""PNG timeline of a simulation: engines (rows) x virtual time, colour = running sequences.

matplotlib (Agg) is imported only when a timeline is drawn.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report.runs
    horizon = max((r.makespan_s for r in runs), default=0.0) or 1.0
    edges = np.linspace(0.0, horizon, bins + 1)
    n_eng = len(runs[0].engines) if runs else 0
    height = min(2.2 + 0.012 * n_eng, 7.0)
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 0.6 + height * len(runs)), sharex=True, squeeze=False)
    vmax = max((e.max_concurrency for r in runs for e in r.engines), default=1)
    image = None
    for ax, run in zip(axes[:, 0], runs):
        grid = np.stack([occupancy_grid(e.occupancy_t, e.occupancy_n, edges) for e in run.engines])
        # time past this policy's own makespan is blank
        grid[:, edges[:-1] >= run.makespan_s] = np.nan
        image = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0, vmax=vmax,
                          extent=(0.0, horizon, len(run.engines) - 0.5, -0.5))
        n_fast = sum(1 for e in run.engines if e.pool == "fast")
        if 0 < n_fast < len(run.engines):
            ax.axhline(n_fast - 0.5, color="white", lw=1.0)
        for b in run.batches[1:]:
            ax.axvline(b.start_s, color="white", lw=0.6, ls=":")
        ax.set_ylabel("engine")
        ax.set_title(f"{run.policy}: makespan {run.makespan_s:.1f} s, bound {run.lower_bound_s:.1f} s "
                     f"(fast above the line, heavy below; dotted = batch starts)", fontsize=9)
        if len(run.engines) <= 16:
            ax.set_yticks(range(len(run.engines)), [e.name for e in run.engines], fontsize=7)
    axes[-1, 0].set_xlabel("virtual time (s)")
    if image is not None:
        fig.colorbar(image, ax=axes[:, 0].tolist(), label="running sequences", shrink=0.8)
    from pdsr_sdk.io.tables import write_png

    write_png(fig, path)
    return Path(path)
