"""PNG plots of a length trace. matplotlib is imported here, lazily, and only its Agg canvas is used
(no pyplot, so nothing global changes in the caller's matplotlib session)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pdsr_sdk.analysis.stats import group_cv, spearman_vs_probe
from pdsr_sdk.errors import DataValueError

#: scatter plots show at most this many points (a fixed random subset) to stay fast on big traces
MAX_SCATTER_POINTS = 50_000

PLOT_FILES = ("lengths_hist.png", "probe_vs_later.png", "cv_hist.png")


def write_plots(lengths, out_dir: str | Path, *, cv_ddof: int = 1, title: str | None = None,
                cap: int | None = None) -> list[Path]:
    """Write the three plots of a [G, N] length array into ``out_dir``; returns their paths.

    - ``lengths_hist.png``: histogram of all response lengths (log x), the probes' outlined over it, each as the
      share of its own samples per bin;
    - ``probe_vs_later.png``: probe length vs each later sample (log-log) with y = x and the mean Spearman
      correlation (with N = 1 it says there is no later sample);
    - ``cv_hist.png``: distribution of the per-group coefficient of variation.

    ``cap``: the length the responses were cut at (:func:`~pdsr_sdk.analysis.length_cap` of the report), marked
    on the first two with the share of responses at it; their pile-up there is the cap's, not the model's.
    """
    x = np.asarray(lengths)
    if x.ndim != 2 or x.size == 0:
        raise DataValueError(f"lengths: write_plots needs a [groups, samples] array with at least one length, got "
                             f"shape {x.shape}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = f" - {title}" if title else ""
    paths = [
        _save(_length_hist(x, suffix, cap), out_dir / PLOT_FILES[0]),
        _save(_probe_scatter(x, suffix, cap), out_dir / PLOT_FILES[1]),
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


def _cap_label(x: np.ndarray, cap: int) -> str:
    at = int((x >= cap).sum())
    return f"cap {cap} tokens: {at} responses ({at / x.size:.1%}) at it"


def _length_hist(x: np.ndarray, suffix: str, cap: int | None):
    from matplotlib.ticker import PercentFormatter

    fig, ax = _figure()
    shown = np.maximum(x, 1)  # a log axis cannot show 0; empty responses are drawn at 1
    bins = _log_bins(shown)
    # each histogram as its share of its own samples (heights sum to 1): as counts the probes' outline, 1/N of all
    # samples, lay flat along the bottom and its shape could not be held against theirs. The bins are of equal
    # width on the log axis, so a share per bin is a density over log length.
    every, probes = shown.ravel(), shown[:, 0]
    ax.hist(every, bins=bins, weights=np.full(every.size, 1 / every.size), color="tab:blue", alpha=0.75,
            label=f"all samples ({x.size})")
    ax.hist(probes, bins=bins, weights=np.full(probes.size, 1 / probes.size), histtype="step", color="tab:red",
            linewidth=1.4, label=f"probes, sample 0 ({x.shape[0]})")
    if cap is not None:
        ax.axvline(max(cap, 1), color="black", linestyle="--", linewidth=1, label=_cap_label(x, cap))
    ax.set_xscale("log")
    ax.set_xlabel("response length (tokens, log scale)")
    ax.set_ylabel("share of samples per bin (each sums to 100%)")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_title("Response length distribution" + suffix)
    # below the axes: inside, it covered the top of the distribution
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize=8, ncol=2)
    return fig


def _probe_scatter(x: np.ndarray, suffix: str, cap: int | None):
    fig, ax = _figure()
    n = x.shape[1]
    ax.set_title("Probe vs later samples" + suffix)
    ax.set_xlabel("probe length, sample 0 (tokens)")
    ax.set_ylabel("later sample length, samples 1..N-1 (tokens)")
    if n < 2:
        ax.text(0.5, 0.5, "no later samples (N = 1): nothing to compare the probe with", ha="center",
                va="center", transform=ax.transAxes)
        return fig
    px = np.repeat(x[:, 0], n - 1).astype(np.float64)
    py = x[:, 1:].ravel().astype(np.float64)
    if px.size > MAX_SCATTER_POINTS:
        keep = np.random.default_rng(0).choice(px.size, MAX_SCATTER_POINTS, replace=False)
        px, py = px[keep], py[keep]
    px, py = np.maximum(px, 1), np.maximum(py, 1)
    rho = spearman_vs_probe(x) if x.shape[0] > 1 else np.full(n - 1, np.nan)
    what = "(probe, later sample)"
    if np.isfinite(rho).any():
        what += f": mean Spearman {float(np.nanmean(rho)):.2f}"
    # a few hundred faint 4-point dots vanished; a big trace needs them faint to show where they crowd
    few = px.size <= 2000
    ax.scatter(px, py, s=12 if few else 4, alpha=0.5 if few else 0.25, color="tab:blue", linewidths=0,
               rasterized=True, label=what)
    lo, hi = min(px.min(), py.min()), max(px.max(), py.max())
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, label="y = x")
    if cap is not None:
        ax.axhline(max(cap, 1), color="grey", linestyle="--", linewidth=1, label=_cap_label(x, cap))
        ax.axvline(max(cap, 1), color="grey", linestyle="--", linewidth=1)
    # room around the points (those at the cap sat on the frame, half hidden); set before the log scale, which
    # warns on the singular limits of a trace whose lengths are all equal
    ax.set_xlim(lo / 1.3, hi * 1.3)
    ax.set_ylim(lo / 1.3, hi * 1.3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    # below the axes: at the upper left it covered the short probes whose later samples hit the cap
    legend = ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize=8, ncol=2)
    for handle in legend.legend_handles:
        if handle is not None:
            handle.set_alpha(1.0)   # the points' own alpha left the legend's marker near invisible
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
    from pdsr_sdk.io.tables import write_png

    write_png(fig, path)   # a tight box: the legend below the axes is kept
    return path
