"""Dispatch policies, found by name.

Built-ins are registered lazily; a user policy is either registered with
``POLICIES.register("name", MyPolicy)`` or named by import path
(``--policy my_pkg.policies:MyPolicy``). A policy is a class implementing
:class:`pdsr_sdk.dispatch.protocols.Dispatcher` (subclass
:class:`pdsr_sdk.policies.base.Policy` for no-op defaults) with a pydantic
``config_model`` for its settings. A class with ``simulation_only = True`` (the ``oracle``
reference schedules) runs only in ``pdsr simulate``
(:func:`pdsr_sdk.policies.resolve.runnable_policies` lists the others).
"""

from __future__ import annotations

from pdsr_sdk.registry import Registry as _Registry

POLICIES: _Registry[type] = _Registry("policy",
                                      register_hint="pdsr_sdk.policies.POLICIES.register('my-policy', MyPolicy), then "
                                                    "policy='my-policy'")
# reference schedules (simulation_only: `pdsr simulate` runs them, `pdsr rollout` and `all` leave them out)
POLICIES.register("oracle", "pdsr_sdk.policies.oracle:OraclePolicy")
POLICIES.register("oracle-probe", "pdsr_sdk.policies.oracle:OracleProbePolicy")
POLICIES.register("baseline", "pdsr_sdk.policies.baseline:BaselinePolicy")
POLICIES.register("v1", "pdsr_sdk.policies.v1:BatchSyncProbePolicy")
POLICIES.register("v2", "pdsr_sdk.policies.v2:StreamingProbePolicy")
POLICIES.register("v2.5", "pdsr_sdk.policies.v25:RankOffloadPolicy")
POLICIES.register("lpt", "pdsr_sdk.policies.lpt:LongestPredictedFirstPolicy")
POLICIES.register("v3", "pdsr_sdk.policies.v3:V3Policy")

__all__ = ["POLICIES"]
