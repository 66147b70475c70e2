"""``pdsr analyze``: the seed 002 statistics and plots of a length trace or trajectories file."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pdsr_cli.common import build_config, config_option, deprecated_flag, format_table, handle_errors, UserPathType
from pdsr_cli.key_value import key_value_argument
from pdsr_cli.input_warnings import warn_if_in_progress
from pdsr_cli.out_dir import remove_other_outputs
from pdsr_sdk.analysis.config import AnalyzeConfig


def _help(name: str) -> str:
    field = AnalyzeConfig.model_fields[name]
    return field.description if field.default is None else f"{field.description} [default: {field.default}]"


@click.command("analyze")
@click.argument("trace_path", metavar="TRACE", type=UserPathType(dir_okay=False, path_type=Path),
                callback=key_value_argument)
@click.option("--top-k", type=float, default=None, help=_help("top_k"))
@click.option("--safe-k", type=float, default=None, help=_help("safe_k"))
@click.option("--fn-length", type=int, default=None, help=_help("fn_length"))
@click.option("--batch-prompts", type=int, default=None, help=_help("batch_prompts"))
@click.option("--capture-top", type=int, default=None, help=_help("capture_top"))
@click.option("--dispatch-batch-prompts", type=int, default=None, help=_help("dispatch_batch_prompts"))
@click.option("--offload-fraction", type=float, default=None, help=_help("offload_fraction"))
@click.option("--cap-multiplier", type=float, default=None, help=_help("cap_multiplier"))
@deprecated_flag("--offload-frac", "--offload-fraction", "old_offload_fraction", type=float, default=None)
@deprecated_flag("--cap-mult", "--cap-multiplier", "old_cap_multiplier", type=float, default=None)
@click.option("--cv-ddof", type=click.Choice(["0", "1"]), default=None, help=_help("cv_ddof"))
@click.option("--plots/--no-plots", default=None, help="Write PNG plots. [default: --plots]")
@click.option("--out-dir", type=UserPathType(file_okay=False, path_type=Path), default=None,
              help="Directory for the plots (lengths_hist.png, probe_vs_later.png, cv_hist.png) and analysis.json; "
                   "files of the same names there are replaced, and those of these four names this run does not write "
                   "(an earlier run's, e.g. its plots after --no-plots) are removed.  [default: the --json file's "
                   "directory (nothing there is removed), else ./analysis]")
@click.option("--json", "json_path", type=UserPathType(dir_okay=False, path_type=Path), default=None,
              help="Where to write the JSON report; an existing file is an error unless --overwrite. "
                   "[default: OUT_DIR/analysis.json]")
@click.option("--overwrite", is_flag=True, default=False, help="Replace an existing --json file.")
@config_option
@handle_errors
def command(trace_path: Path, out_dir: Path | None, json_path: Path | None, overwrite: bool,
            config_path: Path | None, cv_ddof: str | None, **flags) -> None:
    """How well sample 0 (the probe) predicts the lengths of its group's other samples.

    TRACE is a JSONL length trace, a trajectories Parquet/Arrow file from
    `pdsr rollout`, or one of slime's rollout dumps (a .pt file of
    --save-debug-rollout-data). Prints per-group spread (CV), Spearman rank correlation of
    the probe with each later sample, top-K recall and the "safe" rate, the
    false-negative rate of a fixed length threshold, batch-level capture of the
    longest task with its cost ratio, and a V2.5 dispatch replay (heavy / fast /
    broke); writes them as JSON and draws PNG plots. Ties (many responses
    at the length cap) are broken at random and the rank statistics are
    their expectation, so a probe with no signal scores chance; a statistic
    that means nothing on the trace is n/a, with a warning on stderr.

    \b
    Example:
      pdsr analyze examples/traces/synth_256x8.jsonl --out-dir analysis
    """
    from pdsr_sdk.analysis import analyze_trace, length_cap, report_notes, report_tables, without_failed, write_plots
    from pdsr_sdk.analysis.plots import PLOT_FILES
    from pdsr_sdk.io.tables import check_new_output, write_text_atomic
    from pdsr_sdk.traces import read_trace

    flags["cv_ddof"] = None if cv_ddof is None else int(cv_ddof)
    for key in ("offload_fraction", "cap_multiplier"):
        old = flags.pop(f"old_{key}")
        if old is not None and flags[key] is None:
            flags[key] = old
    cfg = build_config(AnalyzeConfig, config_path, flags)
    # a folder named by --out-dir (or the default ./analysis) is the run's: an earlier run's files there that this
    # run does not write are removed; the --json file's folder, used when only --json is given, is the user's
    own_dir = out_dir is not None or json_path is None
    out_dir = out_dir or (json_path.parent if json_path is not None else Path("analysis"))
    # a --json file is refused if it exists; OUT_DIR/analysis.json is the folder's, replaced as its plots are
    what = "--json" if json_path is not None else "--out-dir"
    json_path = json_path or out_dir / "analysis.json"
    check_new_output(json_path, what, overwrite=overwrite or what == "--out-dir", config_key=None,
                     inputs=[("TRACE", trace_path)])
    warn_if_in_progress(trace_path, "TRACE")
    trace = read_trace(trace_path, setting="TRACE")
    report = analyze_trace(trace, cfg)
    trace = without_failed(trace)[0]   # the groups the report is of (its warnings say which were left out)

    if own_dir:
        writes = set(PLOT_FILES if cfg.plots else ())
        if json_path.resolve() == (out_dir / "analysis.json").resolve():
            writes.add("analysis.json")
        remove_other_outputs(out_dir, OUT_DIR_FILES, writes, keep=[trace_path])
    plots = []
    if cfg.plots:
        plots = write_plots(trace.matrix(), out_dir, cv_ddof=cfg.cv_ddof, title=trace_path.name,
                            cap=length_cap(report))
    report["plots"] = [str(p) for p in plots]
    write_text_atomic(json.dumps(report, indent=2) + "\n", json_path)

    tables = report_tables(report)
    dv = report["dispatch_v25"]
    groups, samples = report["trace"]["groups"], report["trace"]["samples_per_group"]
    click.echo(f"{trace_path}: {groups} group{'' if groups == 1 else 's'} x {samples} samples\n")   # N >= 2
    click.echo(format_table(tables["summary"]))
    for note in report_notes(report):
        click.echo(note)
    click.echo("\nper later sample j (against the probe, sample 0):")
    click.echo(format_table(tables["per_sample"]))
    click.echo(f"\nV2.5 dispatch replay: batches of {dv['batch_prompts']} prompts, top {dv['heavy_prompts_per_batch']} "
               f"by probe offloaded, fast cap = floor({dv['cap_multiplier']:g} x L_cut) (median cap "
               f"{dv['cap_median']:.0f}); {dv['fast_prompts_broke']} of {dv['fast_prompts']} fast prompts had a break; "
               f"{100 * (dv['wasted_token_frac'] or 0):.1f}% of tokens wasted before breaks")
    click.echo(format_table(tables["dispatch"]))
    click.echo("\n" + _v3_ranking_words(trace.matrix()))
    click.echo("")
    for path in [json_path, *plots]:
        click.echo(f"wrote {path}")
    for warning in report["warnings"]:
        click.echo(f"warning: {warning}", err=True)


#: every file `pdsr analyze --out-dir` writes: the JSON report (without --json) and the three plots (without
#: --no-plots; pdsr_sdk.analysis.plots.PLOT_FILES, which a test holds to this)
OUT_DIR_FILES = ("analysis.json", "lengths_hist.png", "probe_vs_later.png", "cv_hist.png")


#: what v3 does besides its rank: the line about the rank must not read as "v3 is baseline here"
OTHER_RULES = ("its other rules, such as moving the tail to a lighter engine, still act: pdsr simulate --policy all "
               "measures what it buys on the trace")


def _v3_ranking_words(lengths) -> str:
    """What v3's ranking rule would decide on this trace: the correlation it measures (log probe length against log
    sibling length, over its window of pairs, in trace order) against its threshold, with the default settings."""
    from pdsr_sdk.policies.probe_correlation import window_correlations
    from pdsr_sdk.policies.v3.settings import RankingSettings

    rank = RankingSettings()
    values = window_correlations(lengths, rank.correlation_window, rank.min_pairs)
    if not values:
        return (f"v3 (default settings): the trace holds fewer than ranking.min_pairs = {rank.min_pairs} "
                f"probe/sibling pairs, so v3 would not rank by the probe: it would take waiting work in queue order, "
                f"as baseline does ({OTHER_RULES})")
    above = sum(v >= rank.min_correlation for v in values) / len(values)
    verdict = ("ranks waiting work by the probe throughout" if above == 1.0 else
               "takes waiting work in queue order throughout, as baseline does (the probe predicts too little to rank "
               f"by; {OTHER_RULES})" if above == 0.0
               else f"ranks by the probe {above:.0%} of the time, else runs in queue order")
    return (f"v3 (default settings): the correlation of log probe length with log sibling length, over its window "
            f"of {rank.correlation_window:,} pairs, reads from {min(values):.2f} to {max(values):.2f} "
            f"(last {values[-1]:.2f}) "
            f"against ranking.min_correlation = {rank.min_correlation:g}: v3 {verdict}")
