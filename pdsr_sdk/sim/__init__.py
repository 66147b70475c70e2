"""The simulator: replay length traces through dispatch policies on simulated engines, in virtual time.

``simulate(trace, SimulateConfig(...))`` runs every selected policy and returns a
:class:`~pdsr_sdk.sim.report.SimulationReport`; :class:`SimEngine` is the
``sim`` engine backend; :mod:`pdsr_sdk.sim.cost` holds the cost model and
:mod:`pdsr_sdk.sim.calibrate` fits it from a real run; ``simulate_steps`` runs K training steps as a
stream with partial rollout (:mod:`pdsr_sdk.sim.steps`). Nothing heavy is
imported here (matplotlib only when a timeline is drawn).
"""

from pdsr_sdk.sim.config import CalibrateConfig, EngineProfile, SimulateConfig, default_profile
from pdsr_sdk.sim.batches import trace_batches
from pdsr_sdk.sim.driver import run_policy, simulate
from pdsr_sdk.sim.engine import SimEngine
from pdsr_sdk.sim.steps import run_steps, simulate_steps

__all__ = ["CalibrateConfig", "EngineProfile", "SimEngine", "SimulateConfig", "default_profile", "run_policy",
           "run_steps", "simulate", "simulate_steps", "trace_batches"]
