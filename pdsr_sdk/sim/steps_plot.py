"""The curve of a multi-step simulation (``steps.png``): steady step / on-policy step against the off-policy token
share, one point per over-provision F, and with ``update: auto`` one curve per update."""

from __future__ import annotations

from pdsr_sdk.sim.steps_report import StepsReport

#: (line colour, marker) of each update's curve
STYLES = {"all": ("tab:blue", "o"), "staggered": ("tab:green", "s")}


def write_steps_plot(report: StepsReport, path) -> str:
    """PNG: steady step time / on-policy step against the off-policy token share, one point per F, with
    each point's work bound below it."""
    from pdsr_sdk.io.tables import write_png
    from pdsr_sdk.sim.timeline import agg_figure

    rows = report.rows()
    fig = agg_figure((6, 4.2))
    ax = fig.add_subplot()
    xs = [r["off_policy"] * 100 for r in rows]
    ys = [r["ratio"] or 0.0 for r in rows]
    updates = list(dict.fromkeys(run.update for run in report.runs))
    for update in updates:   # a curve per update: the runs of one are in order of F
        at = [i for i, run in enumerate(report.runs) if run.update == update]
        colour, marker = STYLES[update]
        named = f" (update {update})" if len(updates) > 1 else ""
        ax.plot([xs[i] for i in at], [ys[i] for i in at], f"{marker}-", color=colour,
                label=f"all off-policy tokens{named}")
        ax.plot([rows[i]["partial"] * 100 for i in at], [ys[i] for i in at], f"{marker}--", color="tab:orange",
                mfc="none", label=f"of them: carried partial responses{named}")
    per_token = [r["per_token"] for r in rows]
    if any(p is not None and p != y for p, y in zip(per_token, ys)):   # restarts changed the consumed lengths
        ax.plot(xs, [p or 0.0 for p in per_token], "x", color="tab:blue", alpha=0.7,
                label="per consumed token (ratio / token_ratio)")
    base = report.baseline_step_s
    if base > 0:   # the floor under each point: its consumed tokens generated at full occupancy
        ax.plot(xs, [r.work_bound_s / base for r in report.runs], "_", color="grey", ms=14, mew=2,
                label="work bound (consumed tokens at full occupancy)")
    pick = report.fastest_within()
    if pick is not None:   # the over-provision to run within the partial-share budget
        ax.axvline(report.cfg.max_partial_share * 100, color="tab:orange", lw=0.8, ls=":",
                   label=f"partial-share budget {report.cfg.max_partial_share:.0%}")
        which = f", update {pick.update}" if len(updates) > 1 else ""
        ax.plot([pick.partial_share * 100], [report.ratio(pick) or 0.0], "*",
                color="tab:red", ms=13, label=f"fastest within it: F={pick.over_provision:.3g}{which}")
    # below the axes: inside, it covered the work bounds and the curve's right end (high F)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)
    every = 1 if len(rows) <= 6 else 2   # the search's 11 points: label every other one
    right = max(xs)
    for i, (x, y, r) in enumerate(zip(xs, ys, rows)):
        if i % every:
            continue
        # the rightmost point sits at the axes' edge: its label goes to its left, inside
        ax.annotate(f"F={r['F']:.3g}", (x, y), textcoords="offset points", xytext=(-5 if x == right else 5, 5),
                    ha="right" if x == right else "left", fontsize=8)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("off-policy tokens (%)")
    ax.set_ylabel("steady step / on-policy step")
    cfg = report.cfg
    s = "none" if cfg.max_staleness is None else str(cfg.max_staleness)
    trainer = (f", {'pipelined' if cfg.pipeline else 'synchronous'} trainer {cfg.trainer_s:g} s + load "
               f"{cfg.weight_update_s:g} s" if cfg.trained else "")
    ax.set_title(f"Steady step against off-policy tokens, one point per over-provision F\n{report.runs[0].policy}, "
                 f"B={cfg.step_groups or cfg.batch_size}, K={cfg.steps}, max staleness {s}{trainer}", fontsize=9)
    ax.set_ylim(bottom=0)
    write_png(fig, path)
    return str(path)
