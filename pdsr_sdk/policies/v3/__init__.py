"""The ``v3`` policy as a package: a coordinator (:mod:`.policy`) handing each hook to its rules, one module each,
over a shared ledger (:mod:`.ledger`). ``pdsr_sdk.policies.v3:V3Policy`` is the registered class."""

from pdsr_sdk.policies.v3.policy import V3Policy

__all__ = ["V3Policy"]
