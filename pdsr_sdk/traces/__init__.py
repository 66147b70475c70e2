"""Length traces: per-prompt-group response lengths (sample 0 is the probe).

``read_trace`` reads a JSONL trace, a trajectories Parquet/Arrow file or slime's rollout dump (``read_slime_dump``,
a ``.pt`` file of ``--save-debug-rollout-data``), ``read_any_trace`` also your own rollout log (one row per
response, Parquet/Arrow/JSONL/CSV, columns mapped by name), a folder or pattern of slime's dumps and verl's
generation dumps (``read_verl_dump``, text counted with a tokenizer),
``write_trace_jsonl`` writes the JSONL form, ``synth_trace`` draws a
synthetic long-tailed trace, ``default_trace_path`` is the built-in one. ``WORKLOADS`` is the
family of named workloads (seeded generators with their own defaults and measurement) policies are
judged on.
"""

from pdsr_sdk.traces.config import TraceSynthConfig
from pdsr_sdk.traces.family import (
    WORKLOADS,
    Measurement,
    WorkloadMember,
    register_workload,
    resample_trace,
    workload,
)
from pdsr_sdk.traces.io import (
    detect_format,
    read_any_trace,
    read_responses_trace,
    read_slime_dump,
    read_trace,
    read_trace_jsonl,
    read_trajectories_trace,
    read_verl_dump,
    trace_from_trajectories,
    write_trace_jsonl,
)
from pdsr_sdk.traces.synth import default_trace_path, synth_trace
from pdsr_sdk.traces.trace import LengthTrace

__all__ = [
    "LengthTrace",
    "Measurement",
    "TraceSynthConfig",
    "WORKLOADS",
    "WorkloadMember",
    "default_trace_path",
    "detect_format",
    "read_any_trace",
    "read_responses_trace",
    "read_slime_dump",
    "read_trace",
    "read_trace_jsonl",
    "read_trajectories_trace",
    "read_verl_dump",
    "register_workload",
    "resample_trace",
    "synth_trace",
    "trace_from_trajectories",
    "workload",
    "write_trace_jsonl",
]
