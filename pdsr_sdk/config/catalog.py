"""Every config model and output schema pdsr exports to ``schemas/``.

Entries are lazy import paths so that listing them imports nothing heavy.
Add a line here when you add a config model or an output table; a policy's settings model
(``policy-<name>``) comes from the policy registry, so a registered policy needs no line here.
"""

from __future__ import annotations

import json
from pathlib import Path

from pdsr_sdk.registry import Registry

#: JSON Schema of each config model, written to ``schemas/<name>.schema.json``.
CONFIG_MODELS: Registry[type] = Registry("config model")
CONFIG_MODELS.register("gae", "pdsr_sdk.gae.config:GaeConfig")
CONFIG_MODELS.register("score", "pdsr_sdk.scoring.config:ScoreConfig")
CONFIG_MODELS.register("analyze", "pdsr_sdk.analysis.config:AnalyzeConfig")
CONFIG_MODELS.register("trace_synth", "pdsr_sdk.traces.config:TraceSynthConfig")
CONFIG_MODELS.register("simulate", "pdsr_sdk.sim.config:SimulateConfig")
CONFIG_MODELS.register("simulate_calibrate", "pdsr_sdk.sim.config:CalibrateConfig")
CONFIG_MODELS.register("rollout", "pdsr_sdk.rollout.config:RolloutConfig")

#: config models another registry knows: schema-name prefix -> import path of a function returning
#: {name: model}, written as ``schemas/<prefix>-<name>.schema.json``
CONFIG_FAMILIES: Registry[object] = Registry("config model family")
CONFIG_FAMILIES.register("policy", "pdsr_sdk.policies.resolve:settings_models")

#: Arrow schema of each output table: import path of a zero-argument function
#: returning a ``pyarrow.Schema``; written to ``schemas/<name>.arrow.json``.
OUTPUT_SCHEMAS: Registry[object] = Registry("output schema")
OUTPUT_SCHEMAS.register("gae_output", "pdsr_sdk.gae.table:gae_output_schema")
OUTPUT_SCHEMAS.register("score_output", "pdsr_sdk.scoring.table:score_output_schema")
OUTPUT_SCHEMAS.register("trajectory", "pdsr_sdk.dispatch.trajectory:trajectory_schema")
OUTPUT_SCHEMAS.register("carry", "pdsr_sdk.dispatch.trajectory:carry_schema")


def config_models() -> dict[str, type]:
    """Schema name -> config model: every entry of CONFIG_MODELS and of each CONFIG_FAMILIES function."""
    models = {name: CONFIG_MODELS.get(name) for name in CONFIG_MODELS.names()}
    for prefix in CONFIG_FAMILIES.names():
        models.update({f"{prefix}-{name}": model for name, model in CONFIG_FAMILIES.get(prefix)().items()})
    return models


def render_schemas() -> dict[str, str]:
    """File name -> file text for every exported schema (deterministic)."""
    files: dict[str, str] = {}
    for name, model in config_models().items():
        schema = with_policy_settings(model.model_json_schema())
        files[f"{name}.schema.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    for name in OUTPUT_SCHEMAS.names():
        schema = OUTPUT_SCHEMAS.get(name)()
        files[f"{name}.arrow.json"] = json.dumps(arrow_schema_to_json(schema), indent=2) + "\n"
    return files


def with_policy_settings(schema: dict) -> dict:
    """A config's schema whose ``policy_settings`` (a mapping validated by the config, so pydantic's schema says
    nothing of it) describes the settings of each registered policy under its name, so that an editor checks
    ``policy_settings.v3.migration.stall_share`` as pdsr does; other keys (a preset's name) stay free."""
    field = schema.get("properties", {}).get("policy_settings")
    if field is None:
        return schema
    from pdsr_sdk.policies.resolve import settings_models

    defs = schema.setdefault("$defs", {})
    properties = {}
    for name, model in sorted(settings_models().items()):
        prefix = f"policy-{name}-"   # the policies' models, apart from the config's own and from each other's
        sub = model.model_json_schema(ref_template=f"#/$defs/{prefix}{{model}}")
        defs.update({prefix + key: value for key, value in sub.pop("$defs", {}).items()})
        defs[prefix + model.__name__] = sub
        properties[name] = {"$ref": f"#/$defs/{prefix}{model.__name__}"}
    field["properties"] = properties
    return schema


def write_schemas(directory: str | Path) -> list[Path]:
    """Write every schema into ``directory`` (each atomically: an interrupted run leaves no half-written schema);
    returns the paths written."""
    from pdsr_sdk.io.tables import write_text_atomic

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_schemas().items():
        path = directory / name
        write_text_atomic(text, path)
        written.append(path)
    return written


def arrow_schema_to_json(schema) -> dict:
    """A readable JSON form of a pyarrow schema: name, type, nullable, description."""
    fields = []
    for field in schema:
        meta = {k.decode(): v.decode() for k, v in (field.metadata or {}).items()}
        fields.append({
            "name": field.name,
            "type": str(field.type),
            "nullable": field.nullable,
            "description": meta.get("description", ""),
        })
    meta = {k.decode(): v.decode() for k, v in (schema.metadata or {}).items()}
    return {"fields": fields, "metadata": meta}
