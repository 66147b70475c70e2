"""Statistics of rollout length traces (seed 002): how well one probe sample predicts its group.

``analyze_trace(trace, config)`` returns a JSON-able report; the statistics
are pure array functions in ``pdsr_sdk.analysis.stats`` (with naive twins in
``reference``); ``write_plots`` draws PNGs (matplotlib is imported only when it is called).
"""

from pdsr_sdk.analysis.config import AnalyzeConfig
from pdsr_sdk.analysis.plots import write_plots
from pdsr_sdk.analysis.report import DEFINITIONS, analyze_trace, length_cap, without_failed
from pdsr_sdk.analysis.report_text import report_notes, report_tables
from pdsr_sdk.analysis.dispatch_replay import DispatchCounts, dispatch_v25
from pdsr_sdk.analysis.stats import (
    BatchCapture,
    FalseNegatives,
    average_ranks,
    batch_capture,
    false_negatives,
    group_cv,
    offload_count,
    safe_rate,
    spearman_vs_probe,
    top_k_count,
    top_k_prob,
    top_k_recall,
)


__all__ = [
    "AnalyzeConfig",
    "BatchCapture",
    "DEFINITIONS",
    "DispatchCounts",
    "FalseNegatives",
    "analyze_trace",
    "average_ranks",
    "batch_capture",
    "dispatch_v25",
    "false_negatives",
    "group_cv",
    "length_cap",
    "offload_count",
    "report_notes",
    "report_tables",
    "safe_rate",
    "spearman_vs_probe",
    "top_k_count",
    "top_k_prob",
    "top_k_recall",
    "without_failed",
    "write_plots",
]
