"""What `pdsr analyze`'s PNGs show, read from the figures' artists (never from pixels): the length cap and the
share of responses at it, the mean Spearman correlation, legends off the data, and degenerate traces drawn
without an error or a warning."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from click.testing import CliRunner

import pdsr_sdk.io.tables as tables
from pdsr_cli.main import cli
from pdsr_sdk.analysis import analyze_trace, length_cap, write_plots
from pdsr_sdk.analysis.reference import naive_spearman_vs_probe
from pdsr_sdk.errors import DataValueError
from pdsr_sdk.traces import LengthTrace, write_trace_jsonl

#: four groups of three; four responses cut at 512 (finish reason 'length')
CUT = np.array([[100, 512, 300], [512, 200, 512], [50, 60, 70], [400, 512, 80]])


@pytest.fixture
def drawn(monkeypatch):
    """The figures write_plots saves, by file name (they are written as usual)."""
    figures = {}
    save = tables.write_png

    def keep(fig, path, **kw):
        figures[path.name] = fig
        save(fig, path, **kw)

    monkeypatch.setattr(tables, "write_png", keep)
    return figures


def cap_lines(ax, cap):
    return [line for line in ax.get_lines() if set(line.get_xdata()) == {cap} or set(line.get_ydata()) == {cap}]


def legend_texts(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_the_cap_and_the_share_at_it_are_marked(tmp_path, drawn):
    write_plots(CUT, tmp_path, cap=512)
    hist = drawn["lengths_hist.png"].axes[0]
    scatter = drawn["probe_vs_later.png"].axes[0]
    label = "cap 512 tokens: 4 responses (33.3%) at it"
    assert len(cap_lines(hist, 512)) == 1 and label in legend_texts(hist)
    assert len(cap_lines(scatter, 512)) == 2 and label in legend_texts(scatter)   # later samples and probes
    rho = np.nanmean(naive_spearman_vs_probe(CUT.tolist()))
    assert legend_texts(scatter)[0] == f"(probe, later sample): mean Spearman {rho:.2f}"
    # the points at the cap sit inside the frame, not on it
    for low, high in (scatter.get_xlim(), scatter.get_ylim()):
        assert low < 50 and high > 512
    for fig in drawn.values():
        fig.canvas.draw()
    for name in ("lengths_hist.png", "probe_vs_later.png"):
        ax = drawn[name].axes[0]
        assert not ax.get_legend().get_window_extent().overlaps(ax.get_window_extent()), name


def test_all_samples_and_the_probes_are_drawn_as_shares_of_their_own(tmp_path, drawn):
    """The probes' outline was drawn in counts over all samples' (1/N of them): flat along the bottom, its shape
    not comparable. Each is now its share of its own samples per bin: heights sum to 1 and are numpy's counts over
    the same bins divided by the samples counted, and the y axis says so."""
    rng = np.random.default_rng(3)
    lengths = np.concatenate([rng.integers(20, 60, (30, 8)), rng.integers(300, 900, (10, 8))])
    lengths[:, 0] = rng.integers(20, 900, 40)   # probes spread otherwise than the rest
    write_plots(lengths, tmp_path)
    ax = drawn["lengths_hist.png"].axes[0]
    bars = [p for p in ax.patches if p.get_fill()]
    (outline,) = [p for p in ax.patches if not p.get_fill()]
    edges = np.array([b.get_x() for b in bars] + [bars[-1].get_x() + bars[-1].get_width()])
    heights = np.array([b.get_height() for b in bars])
    corners = outline.get_xy()[1:2 * len(bars):2]   # a step outline: (left edge, top) of each bin
    assert np.allclose(corners[:, 0], edges[:-1])
    assert np.isclose(heights.sum(), 1) and np.isclose(corners[:, 1].sum(), 1)
    assert np.allclose(heights, np.histogram(lengths.ravel(), edges)[0] / lengths.size)
    assert np.allclose(corners[:, 1], np.histogram(lengths[:, 0], edges)[0] / lengths.shape[0])
    assert ax.get_ylabel() == "share of samples per bin (each sums to 100%)"


def test_without_a_cap_nothing_is_marked(tmp_path, drawn):
    write_plots(CUT, tmp_path)
    assert cap_lines(drawn["lengths_hist.png"].axes[0], 512) == []
    assert not any(t.startswith("cap") for t in legend_texts(drawn["probe_vs_later.png"].axes[0]))


def test_length_cap_reads_the_cap_as_the_report_does():
    reasons = np.where(CUT == 512, "length", "stop")
    assert length_cap(analyze_trace(LengthTrace.from_matrix(CUT, finish_reasons=reasons))) == 512
    # no finish reasons: the max is a cap when at least 20% of responses reach it (4 of 12 here, 1 of 12 below)
    assert length_cap(analyze_trace(LengthTrace.from_matrix(CUT))) == 512
    few = np.where(CUT == 512, 500, CUT)
    few[0, 1] = 512
    assert length_cap(analyze_trace(LengthTrace.from_matrix(few))) is None
    # finish reasons with no 'length': uncut, whatever the max
    assert length_cap(analyze_trace(LengthTrace.from_matrix(CUT, finish_reasons=np.full(CUT.shape, "stop")))) is None


def test_analyze_marks_the_cap_it_reports(tmp_path, drawn):
    path = tmp_path / "t.jsonl"
    write_trace_jsonl(LengthTrace.from_matrix(CUT, finish_reasons=np.where(CUT == 512, "length", "stop")), path)
    result = CliRunner().invoke(cli, ["analyze", str(path), "--out-dir", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert "cap 512 tokens: 4 responses (33.3%) at it" in legend_texts(drawn["lengths_hist.png"].axes[0])


@pytest.mark.parametrize("name, lengths, cap", [
    ("one sample a group", [[5], [10], [20]], None),
    ("one group", [[5, 10, 20, 40]], None),
    ("one length", [[7]], None),
    ("all equal, at the cap", [[100] * 4] * 8, 100),
    ("all empty", [[0] * 4] * 4, None),
])
def test_degenerate_lengths_draw_without_an_error_or_a_warning(tmp_path, drawn, name, lengths, cap):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        paths = write_plots(np.array(lengths), tmp_path, cap=cap)
    assert [p.read_bytes()[:8] for p in paths] == [b"\x89PNG\r\n\x1a\n"] * 3
    scatter = drawn["probe_vs_later.png"].axes[0]
    if len(lengths[0]) == 1:   # it raised on the empty scatter; now it says why there is none
        assert [t.get_text() for t in scatter.texts] == ["no later samples (N = 1): nothing to compare the probe with"]
    else:
        assert len(scatter.collections) == 1


def test_no_lengths_is_a_clear_error(tmp_path):
    with pytest.raises(DataValueError, match=r"lengths: write_plots needs a \[groups, samples\] array with at least "
                                             r"one length, got shape \(0, 4\)"):
        write_plots(np.zeros((0, 4), dtype=int), tmp_path)
    assert not list(tmp_path.iterdir())
