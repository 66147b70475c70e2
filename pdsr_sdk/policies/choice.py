"""The checks of a config that names dispatch policies (``policy`` and ``policy_settings``), shared by
``pdsr rollout``'s and ``pdsr simulate``'s configs: a policy class given in code is stored by name, every policy
named exists, and each selected policy's settings are validated once and carried typed."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import ValidationInfo, field_validator, model_validator

from pdsr_sdk.config import ConfigModel

__all__ = ["PolicyChoice"]


class PolicyChoice(ConfigModel):
    """A base (no fields of its own) of a config with the fields ``policy`` and ``policy_settings``.
    ``simulation``: the simulator-only reference schedules (``oracle``) may be named too."""

    simulation: ClassVar[bool] = False

    @field_validator("policy", mode="before", check_fields=False)
    @classmethod
    def _policy_class_by_name(cls, policy: Any) -> Any:
        """A policy class given in code is stored as its registered name or import path (``policy_spec``)."""
        from pdsr_sdk.policies.resolve import policy_spec

        return policy_spec(policy)

    @field_validator("policy", "policy_settings", check_fields=False)
    @classmethod
    def _known_policies(cls, value: Any) -> Any:
        """Every policy named (by ``policy``, or as a key of ``policy_settings``) exists, so that an unknown one
        is reported at its key."""
        from pdsr_sdk.policies.resolve import check_policies

        check_policies(value, simulation=cls.simulation)
        return value

    @model_validator(mode="after")
    def _typed_policy_settings(self, info: ValidationInfo) -> "PolicyChoice":
        """Each selected policy's settings (and each one given) validated once, here, and carried typed."""
        from pdsr_sdk.policies.resolve import type_policy_settings

        policy: Any = getattr(self, "policy")
        self.policy_settings = type_policy_settings(policy, getattr(self, "policy_settings"),
                                                    simulation=self.simulation,
                                                    origin=(info.context or {}).get("source"))
        return self
