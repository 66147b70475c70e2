"""What the simulator's PNGs show, read from the figures' artists (never from pixels): the timeline tells an idle
engine from one running the long tail's last sequence, marks batch starts and step ends, and steps.png keeps its
legend off the points."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.colors import to_rgba

import pdsr_sdk.io.tables as tables
from pdsr_sdk.errors import ConfigValueError
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.driver import simulate
from pdsr_sdk.sim.steps import simulate_steps
from pdsr_sdk.sim.steps_plot import write_steps_plot
from pdsr_sdk.sim.timeline import MARK_COLOUR, timeline_image, write_steps_timeline, write_timeline
from sim_cases import UNIT, hand_trace, small_cfg, small_trace


@pytest.fixture
def drawn(monkeypatch):
    """The figures the plot functions save (they are written as usual)."""
    figures = []
    save = tables.write_png

    def keep(fig, path, **kw):
        figures.append(fig)
        save(fig, path, **kw)

    monkeypatch.setattr(tables, "write_png", keep)
    return figures


def marks(ax) -> list[float]:
    """x of the panel's vertical mark lines (batch starts / step ends)."""
    return [line.get_xdata()[0] for line in ax.get_lines()
            if to_rgba(line.get_color()) == to_rgba(MARK_COLOUR)]


def test_timeline_image_reads_idle_below_the_scale_and_counts_on_a_log_scale():
    grid = np.array([[0.0, 0.25, 1.0, 10.0, 100.0, np.nan]])
    image = timeline_image(grid)
    assert image[0, 0] == -1.0                        # idle: under the colour scale (grey)
    assert image[0, 1] == 0.0                         # a sequence a quarter of the bin reads as one, not idle
    assert image[0, 2:5].tolist() == [0.0, 1.0, 2.0]  # log10 of 1, 10, 100
    assert np.isnan(image[0, 5])                      # past the panel's end: blank


def test_timeline_shows_which_engine_ran_and_which_sat_idle(tmp_path, drawn):
    """One token per second, one sample of 10 tokens then one of 4 (a batch each), one fast and one heavy engine:
    in every second exactly one engine runs one sequence and the other is idle; the second batch starts at 10 s."""
    cfg = SimulateConfig(policy="baseline", fast=1, heavy=1, batch_size=1, timeline=True,
                         profiles={"fast": UNIT, "heavy": UNIT})
    report = simulate(hand_trace([10, 4]), cfg)
    path = write_timeline(report, tmp_path / "timeline.png", bins=14)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (fig,) = drawn
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == len(report.runs) == 1
    ax = panels[0]
    image = np.asarray(ax.images[0].get_array())
    assert image.shape == (2, 14)
    assert sorted(image[:, 0].tolist()) == [-1.0, 0.0]
    assert (np.sort(image, axis=0) == [[-1.0], [0.0]]).all()   # each second: one idle, one running one sequence
    assert marks(ax) == [10.0]
    pool_lines = [line for line in ax.get_lines() if line.get_ydata()[0] == line.get_ydata()[-1] == 0.5]
    assert len(pool_lines) == 1                                # fast above it, heavy below
    assert ax.get_title() == "baseline: makespan 14 s, bound 14 s"
    assert "grey = idle" in fig.get_suptitle() and "batch starts" in fig.get_suptitle()
    bar = fig.axes[-1]
    assert [t.get_text() for t in bar.get_yticklabels()] == ["1", "2", "5", "10", "20", "50"]


def test_steps_timeline_marks_each_step_end_and_blanks_past_each_run(tmp_path, drawn):
    report = simulate_steps(small_trace(), small_cfg(policy="v3", max_staleness=2, timeline=True, out_dir=tmp_path))
    write_steps_timeline(report, tmp_path / "timeline.png", bins=120)
    (fig,) = drawn
    panels = [ax for ax in fig.axes if ax.images]
    runs = report.timeline_runs()
    assert len(panels) == len(runs) == 4
    horizon = max(run.horizon_s for run in runs)
    edges = np.linspace(0.0, horizon, 121)
    for ax, run in zip(panels, runs):
        assert marks(ax) == pytest.approx([s.end_s for s in run.steps[:-1]], rel=1e-12)
        image = np.asarray(ax.images[0].get_array())
        assert np.isnan(image[:, edges[:-1] >= run.horizon_s]).all()
        assert not np.isnan(image[:, edges[:-1] < run.horizon_s]).any()
        assert ax.get_title().startswith(f"v3, F={run.over_provision:g}: steady step ")
    assert "step ends" in fig.get_suptitle()


@pytest.mark.parametrize("max_partial_share", [None, 0.2])
def test_steps_plot_keeps_its_legend_off_the_points(tmp_path, drawn, max_partial_share):
    """The legend sat inside the axes (lower right), over the work-bound marks and the high-F end of the curve."""
    report = simulate_steps(small_trace(), small_cfg(policy="v3", max_staleness=2,
                                                     max_partial_share=max_partial_share))
    write_steps_plot(report, tmp_path / "steps.png")
    (fig,) = drawn
    (ax,) = fig.axes
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    assert not legend.overlaps(ax.get_window_extent())
    assert ax.get_title().startswith("Steady step against off-policy tokens, one point per over-provision F\nv3, ")
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("off-policy tokens (%)", "steady step / on-policy step")
    assert len(ax.texts) >= 2                                  # the F labels
    # each F label within the axes' width: the rightmost point's (the highest F) ran over the right edge
    box = ax.get_window_extent()
    for text in ax.texts:
        label = text.get_window_extent()
        assert box.x0 <= label.x0 and label.x1 <= box.x1, (text.get_text(), label, box)


def test_one_engine_one_step_draws(tmp_path, drawn):
    """Degenerate runs draw: one engine (no pool line), one step (no step end inside the run)."""
    cfg = SimulateConfig(policy="baseline", fast=1, heavy=0, batch_size=2, steps=1, over_provision=0.0,
                         profiles={"fast": UNIT}, timeline=True, out_dir=tmp_path)
    report = simulate_steps(hand_trace([3, 5, 7]), cfg)
    write_steps_plot(report, tmp_path / "steps.png")
    write_steps_timeline(report, tmp_path / "timeline.png")
    ax = [a for a in drawn[1].axes if a.images][0]
    assert marks(ax) == [] and len(ax.get_lines()) == 0
    assert "black line" not in drawn[1].get_suptitle()


def test_a_run_that_recorded_no_occupancy_is_refused_not_drawn_idle(tmp_path):
    """Drawn without recording, every engine read as idle throughout (a batch run) or the drawing died on an
    IndexError deep in numpy (a steps run)."""
    batch = simulate(hand_trace([10, 4]), SimulateConfig(policy="baseline", fast=1, heavy=0, batch_size=1,
                                                         timeline=False, profiles={"fast": UNIT}))
    with pytest.raises(ConfigValueError, match="timeline: baseline recorded no engine occupancy; simulate with "
                                               "timeline=True"):
        write_timeline(batch, tmp_path / "timeline.png")
    steps = simulate_steps(small_trace(), small_cfg(over_provision=0.5))
    with pytest.raises(ConfigValueError, match="timeline: baseline, F=0.5 recorded no engine occupancy"):
        write_steps_timeline(steps, tmp_path / "steps_timeline.png")
    assert not list(tmp_path.iterdir())


def test_update_auto_draws_a_curve_and_names_a_panel_per_update(tmp_path, drawn):
    """--update auto at one F: steps.png has the curves of both updates (each labelled with its update) and the
    timeline a panel per run, each titled with its update (two panels of one F read alike otherwise)."""
    report = simulate_steps(small_trace(groups=200), small_cfg(policy="v3", max_staleness=2, update="auto",
                                                               over_provision=0.5, timeline=True, out_dir=tmp_path))
    assert [r.update for r in report.runs] == ["all", "staggered"]
    write_steps_plot(report, tmp_path / "steps.png")
    write_steps_timeline(report, tmp_path / "timeline.png")
    plot, timeline = drawn
    labels = [line.get_label() for line in plot.axes[0].get_lines()]
    for update in ("all", "staggered"):
        assert f"all off-policy tokens (update {update})" in labels
        assert f"of them: carried partial responses (update {update})" in labels
    titles = [ax.get_title() for ax in timeline.axes if ax.images]
    assert [t.split(":")[0] for t in titles] == ["v3, F=0.5, update all", "v3, F=0.5, update staggered"]
