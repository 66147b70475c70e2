"""The simulator's PNGs (timeline.png, steps.png) are drawn headless (no MPLBACKEND, no display) and leave the
caller's matplotlib as it was: they called matplotlib.use("Agg"), which switched a notebook's backend (or any
other the caller had chosen) to Agg under it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from support import ROOT

SCRIPT = """
import json, sys
import matplotlib
matplotlib.use("svg")                      # the caller's own choice (a notebook's would be inline)
import matplotlib.pyplot as plt
mine = plt.figure()
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.driver import simulate
from pdsr_sdk.sim.steps import simulate_steps
from pdsr_sdk.sim.steps_plot import write_steps_plot
from pdsr_sdk.sim.timeline import write_steps_timeline, write_timeline
from pdsr_sdk.traces import synth_trace
out = sys.argv[1]
trace = synth_trace(groups=8, n=2, seed=0, median_length=40, max_length=120)
cfg = SimulateConfig(policy="baseline", fast=1, heavy=1, batch_size=4, profiles={"fast": {"max_num_seqs": 4}})
write_timeline(simulate(trace, cfg), out + "/timeline.png")
steps = simulate_steps(trace, SimulateConfig(policy="baseline", fast=1, heavy=1, batch_size=2, steps=3,
                                             over_provision=0.5, out_dir=out))   # out_dir: engines record occupancy
write_steps_plot(steps, out + "/steps.png")
write_steps_timeline(steps, out + "/steps_timeline.png")
print(json.dumps({"backend": matplotlib.get_backend(), "figures": plt.get_fignums(), "mine": mine.number}))
"""


def test_plots_are_drawn_headless_and_leave_the_callers_backend(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("MPLBACKEND", "DISPLAY", "WAYLAND_DISPLAY")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    state = json.loads(done.stdout.strip().splitlines()[-1])
    assert state["backend"] == "svg" and state["figures"] == [state["mine"]]
    for name in ("timeline.png", "steps.png", "steps_timeline.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps.png", "steps_timeline.png", "timeline.png"]
