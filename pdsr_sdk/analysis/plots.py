"""PNG plots of a length trace. matplotlib is imported here, lazily, and only its Agg canvas is used
(no pyplot, so nothing global changes in the caller's matplotlib session)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pdsr_sdk.analysis.stats import group_cv

#: scatter plots show at most this many points (a fixed random subset) to stay fast on big traces
MAX_SCATTER_POINTS = 50_000

PLOT_FILES = ("lengths_hist.png", "probe_vs_later.png", "cv_hist.png")


def write_plots(lengths, out_dir: str | Path, *, cv_ddof: int = 1, title: str | None = None) -> list[Path]:
    """Write the three plots of a [G, N] length array into ``out_dir``; returns their paths.

    - ``lengths_hist.png``: histogram of all response lengths (log x), probes overlaid;
    - ``probe_vs_later.png``: probe length vs each later sample (log-log) with y = x;
    - ``cv_hist.png``: distribution of the per-group coefficient of variation.
    """
    x = np.asarray(lengths)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = f" - {title}" if title else ""
    paths = [
        _save(_length_hist(x, suffix), out_dir / PLOT_FILES[0]),
        _save(_probe_scatter(x, suffix), out_dir / PLOT_FILES[1]),
        _save(_cv_hist(group_cv(x, ddof=cv_ddof), cv_ddof, suffix), out_dir / PLOT_FILES[2]),
    ]
    return paths


def _figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.4), dpi=100)
    # fixed margins: an automatic layout engine would draw every figure twice
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.12, top=0.92)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _log_bins(v: np.ndarray, count: int = 60) -> np.ndarray:
    lo = max(float(v.min()), 1.0)
    hi = max(float(v.max()), lo * 1.5)
    return np.geomspace(lo, hi * 1.001, count)


def _length_hist(x: np.ndarray, suffix: str):
    fig, ax = _figure()
    shown = np.maximum(x, 1)  # a log axis cannot show 0; empty responses are drawn at 1
    bins = _log_bins(shown)
    ax.hist(shown.ravel(), bins=bins, color="tab:blue", alpha=0.75, label=f"all samples ({x.size})")
    ax.hist(shown[:, 0], bins=bins, histtype="step", color="tab:red", linewidth=1.4,
            label=f"probes, sample 0 ({x.shape[0]})")
    ax.set_xscale("log")
    ax.set_xlabel("response length (tokens, log scale)")
    ax.set_ylabel("samples")
    ax.set_title("Response length distribution" + suffix)
    ax.legend()
    return fig


def _probe_scatter(x: np.ndarray, suffix: str):
    fig, ax = _figure()
    n = x.shape[1]
    px = np.repeat(x[:, 0], n - 1).astype(np.float64)
    py = x[:, 1:].ravel().astype(np.float64)
    if px.size > MAX_SCATTER_POINTS:
        keep = np.random.default_rng(0).choice(px.size, MAX_SCATTER_POINTS, replace=False)
        px, py = px[keep], py[keep]
    px, py = np.maximum(px, 1), np.maximum(py, 1)
    ax.scatter(px, py, s=4, alpha=0.25, color="tab:blue", linewidths=0, rasterized=True,
               label="(probe, later sample)")
    lo, hi = min(px.min(), py.min()), max(px.max(), py.max())
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, label="y = x")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("probe length, sample 0 (tokens)")
    ax.set_ylabel("later sample length, samples 1..N-1 (tokens)")
    ax.set_title("Probe vs later samples" + suffix)
    ax.legend(loc="upper left")
    return fig


def _cv_hist(cv: np.ndarray, ddof: int, suffix: str):
    fig, ax = _figure()
    finite = cv[np.isfinite(cv)]
    if finite.size:
        ax.hist(finite, bins=50, color="tab:green", alpha=0.8)
        ax.axvline(float(finite.mean()), color="black", linestyle="--", linewidth=1,
                   label=f"mean {finite.mean():.3f}")
        ax.legend()
    ax.set_xlabel(f"coefficient of variation within a group (std ddof={ddof} / mean)")
    ax.set_ylabel("groups")
    ax.set_title("Within-group length spread" + suffix)
    return fig


def _save(fig, path: Path) -> Path:
    from pdsr_sdk.io.tables import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    return path
