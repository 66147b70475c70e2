"""Config models: pydantic v2, ``extra="forbid"``, every field described.

``load_config`` reads YAML or JSON, applies dotted-key overrides (CLI flags)
and validates; errors name the file and the full dotted key.
"""

from pdsr_sdk.config.base import (ConfigModel, load_config, read_config_file, set_dotted, validate_config,
                                  validate_saved)

__all__ = ["ConfigModel", "load_config", "read_config_file", "set_dotted", "validate_config", "validate_saved"]
