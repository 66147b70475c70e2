"""A policy name (registered, preset or import path) and settings -> the class and its validated settings;
which registered policies run on real engines (``--policy all``) and which are simulator-only references;
``--policy`` lists and ``--set [POLICY:]KEY=VALUE`` settings, the same for ``pdsr rollout`` and ``pdsr simulate``."""

from __future__ import annotations

from typing import Any, Mapping

from pydantic import BaseModel

from pdsr_sdk.config import ConfigModel, set_dotted, validate_config
from pdsr_sdk.config.base import deep_merge, upgrade_section
from pdsr_sdk.dispatch.protocols import REQUIRED_HOOKS
from pdsr_sdk.errors import ConfigError, ConfigValueError, PdsrError
from pdsr_sdk.policies import POLICIES
from pdsr_sdk.policies.presets import list_presets, load_preset
from pdsr_sdk.registry import import_object


def policy_spec(policy: Any) -> Any:
    """A config's ``policy`` as given in code -> what the config stores (a string, so that it stays JSON for
    summaries and ``--resume``). A policy class becomes the name it is registered under
    (``POLICIES.register("my-policy", MyPolicy)``), else its import path ``"module:Class"`` when that path
    finds the class; a class that is neither (defined inside a function) is a ConfigValueError saying how to
    register it. Anything else passes through, for the field's own validation."""
    if not isinstance(policy, type):
        return policy
    name = POLICIES.name_of(policy)
    if name is not None:
        return name
    path = f"{policy.__module__}:{policy.__qualname__}"
    if "<locals>" not in policy.__qualname__:
        try:
            if import_object(path) is policy:
                return path
        except PdsrError:
            pass
    raise ConfigValueError(
        f"policy class {policy.__qualname__} (module {policy.__module__}) is not registered and cannot be found "
        f"again by its import path {path!r}; a policy is stored by name: register the class first "
        f"(from pdsr_sdk.policies import POLICIES; POLICIES.register('my-policy', {policy.__name__})) and pass it "
        f"or policy='my-policy', or define it at module level of an importable module")


def policy_class(name: str, *, simulation: bool = False) -> tuple[type, dict[str, Any], str | None]:
    """(policy class, the preset's settings or {}, the preset's file or None) of a registered name, preset or
    import path; the settings are not validated here. A simulation-only reference schedule (``oracle``) is
    refused unless ``simulation`` is true (the simulator's own calls): real engines cannot know the lengths
    it reads."""
    given = name
    preset = load_preset(name)
    source = None
    base: dict[str, Any] = {}
    if preset is not None:
        name, base = preset["policy"], dict(preset.get("settings") or {})
        source = preset["_path"]
    try:
        cls = POLICIES.get(name)
    except ConfigValueError as exc:
        if source is None:   # a name that is neither a policy nor a preset: say which presets there are too
            # (not for an import path that failed to import: the presets are no answer to that)
            presets = [p for p in list_presets() if p not in POLICIES.names()] if ":" not in name else []
            raise ConfigValueError(f"{exc}" + (f"; presets: {', '.join(presets)}" if presets else "")) from None
        # the preset's own policy key is wrong: name the preset file, not the config that chose the preset
        chained = load_preset(name) is not None
        raise ConfigError(f"{source}: policy: {exc}" + (
            f"; {name!r} is a preset itself, and a preset names a policy: copy its settings into this one"
            if chained else "")) from None
    if is_simulation_only(cls) and not simulation:
        raise ConfigError(f"policy {given!r} is a simulator-only reference schedule: it reads a length trace's "
                          f"true lengths, which real engines cannot know; run it with `pdsr simulate`. Policies "
                          f"for real engines: {', '.join(runnable_policies())}")
    check_policy_class(cls, given)
    return cls, base, source


def check_policy_class(cls: Any, name: str) -> None:
    """A ConfigError naming ``name`` unless ``cls`` is a class with the :class:`~pdsr_sdk.dispatch.protocols.Dispatcher`
    hooks every policy has and a pydantic ``config_model``: a run would otherwise fail at its first event."""
    if not isinstance(cls, type):
        raise ConfigError(f"policy {name!r} is {type(cls).__name__} {cls!r}, not a class; a policy is a class "
                          f"(subclass pdsr_sdk.policies.base.Policy)")
    missing = [hook for hook in REQUIRED_HOOKS if not callable(getattr(cls, hook, None))]
    if missing:
        raise ConfigError(f"policy {name!r}: class {cls.__name__} lacks the hook(s) {', '.join(missing)} that every "
                          f"policy has; subclass pdsr_sdk.policies.base.Policy for no-op defaults")
    model = getattr(cls, "config_model", None)
    if model is None:
        raise ConfigError(f"policy {name!r}: class {cls.__name__} has no config_model")
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise ConfigError(f"policy {name!r}: class {cls.__name__}'s config_model is {model!r}, not a pydantic model "
                          f"class (subclass pdsr_sdk.config.ConfigModel; pdsr_sdk.policies.base.NoSettings for none)")


def resolve_policy(name: str, settings: Any = None, *, simulation: bool = False, saved: bool = False,
                   origin: str | None = None) -> tuple[type, Any]:
    """(policy class, validated settings). A preset supplies the policy and base settings that ``settings``
    (a mapping) override, key by key; errors name the preset file and ``policy_settings.<name>.<key>``.
    Settings already typed (an instance of the policy's ``config_model``, as a validated config carries them:
    :func:`type_policy_settings`) are returned as they are, not validated again.

    ``simulation``: see :func:`policy_class`. ``saved``: ``settings`` were read back from a saved run, where a
    removed setting is dropped with a warning instead of being an error. ``origin``: the config file
    ``settings`` came from, which warnings and errors about them name.
    """
    cls, base, source = policy_class(name, simulation=simulation)
    model = cls.config_model
    if isinstance(settings, model):
        return cls, settings
    settings = plain_settings(settings)
    if not base:
        return cls, validate_config(model, settings, source=origin, prefix=f"policy_settings.{name}", saved=saved)
    if issubclass(model, ConfigModel):   # each part's old keys renamed first, each warning naming its origin
        base = upgrade_section(model, base, source=source, prefix="settings")
        settings = upgrade_section(model, settings, source=origin, prefix=f"policy_settings.{name}", saved=saved,
                                   base=base)
    try:
        return cls, validate_config(model, deep_merge(base, settings), source=origin,
                                    prefix=f"policy_settings.{name}", saved=saved)
    except ConfigError:
        # name the preset where its own settings are the problem (its key: settings.<key>), else (above) where
        # the given ones came from: their file, or none for settings passed in code (not the preset below them)
        validate_config(model, base, source=source, prefix="settings", saved=saved)
        raise


def check_policies(names: Any, *, simulation: bool = False) -> None:
    """Each policy ``names`` gives (a ``policy`` spec: :func:`policy_names`; or the keys of ``policy_settings``)
    resolves, for a config's field validator: an unknown one is reported at the key that names it (and the flag
    that set it), not at the config's top level."""
    for name in policy_names(names) if isinstance(names, str) else names:
        policy_class(name, simulation=simulation)
        settings = None if isinstance(names, str) else names[name]
        if not (settings is None or isinstance(settings, (Mapping, BaseModel))):
            raise ConfigValueError(f"{name}: expected a mapping of the policy's settings ({name}: {{KEY: VALUE}}), "
                                   f"got {type(settings).__name__} {settings!r}")


def plain_settings(settings: Any) -> dict[str, Any]:
    """Policy settings as a mapping of what was set: typed settings (a pydantic model) dumped without the
    defaults left alone (so that a preset's values under them still count), a mapping copied."""
    if isinstance(settings, BaseModel):
        return settings.model_dump(mode="json", exclude_unset=True)
    if not (settings is None or isinstance(settings, Mapping)):
        raise ConfigValueError(f"policy settings: expected a mapping of KEY: VALUE, got {type(settings).__name__} "
                               f"{settings!r}")
    return dict(settings or {})


def type_policy_settings(spec: str, given: Mapping[str, Any], *, simulation: bool = False,
                         origin: str | None = None) -> dict[str, Any]:
    """Every policy ``spec`` selects (a name, a list or ``all``: :func:`policy_names`) and every one ``given``
    has settings for -> its typed settings (each preset read and each mapping validated once, here). What a
    config's validator calls, so that settings travel typed from then on."""
    names = [*policy_names(spec), *(n for n in given if n not in policy_names(spec))]
    return {name: resolve_policy(name, given.get(name), simulation=simulation, origin=origin)[1] for name in names}


def is_simulation_only(cls: type) -> bool:
    """Whether a policy class is a reference schedule that only the simulator can run (``simulation_only``)."""
    return bool(getattr(cls, "simulation_only", False))


def runnable_policies() -> list[str]:
    """Registered policies that run on real engines (what ``--policy all`` means): baseline first, then by name."""
    names = [n for n in POLICIES.names() if not is_simulation_only(POLICIES.get(n))]
    return sorted(names, key=lambda n: (n != "baseline", n))


def settings_models() -> dict[str, type]:
    """Policy name -> its settings model, for every registered policy that has one (``pdsr schema``)."""
    models = {n: getattr(POLICIES.get(n), "config_model", None) for n in POLICIES.names()}
    return {n: m for n, m in models.items() if m is not None}


def reference_policies() -> list[str]:
    """Registered simulation-only reference schedules (``oracle``, ``oracle-probe``), by name."""
    return [n for n in POLICIES.names() if is_simulation_only(POLICIES.get(n))]


def streaming_policies() -> list[str]:
    """Registered policies that take new groups while others run (``streaming``): the ones a multi-step run
    (partial rollout across steps) can use."""
    return [n for n in POLICIES.names() if getattr(POLICIES.get(n), "streaming", False)]


def check_streaming(policy_cls: type, name: str) -> None:
    """A ConfigError naming ``name`` and the policies that can run multi-step, unless ``policy_cls`` streams."""
    if not getattr(policy_cls, "streaming", False):
        raise ConfigError(f"policy {name!r} cannot run --steps: it schedules each batch as a whole (its on_batch "
                          f"keeps per-batch state, e.g. a wait for the batch's probes; streaming is False) and "
                          f"cannot take new groups while others run; policies that can: "
                          f"{', '.join(streaming_policies())}")


def policy_names(spec: str) -> list[str]:
    """``all`` -> every registered policy that runs on real engines (baseline first; not the simulator-only
    references); ``a,b`` -> both (``all`` may be one of them); else the one name."""
    names: list[str] = []
    for item in (s.strip() for s in spec.split(",")):
        for name in (runnable_policies() if item == "all" else (item,) if item else ()):
            if name not in names:
                names.append(name)
    if not names:
        raise ConfigError("policy: expected a policy name, a comma-separated list, or 'all'")
    return names


def check_set_targets(items: list[tuple[str | None, str, Any]], selected: list[str],
                      label: str = "policy setting") -> None:
    """A ``POLICY:KEY=VALUE`` setting for a policy that is not selected (or does not exist) is an error
    (it would change nothing), naming the policy and the selected ones. ``label`` names where the setting
    came from (the CLI passes its flag)."""
    for policy, key, _ in items:
        if policy is None or policy in selected:
            continue
        known = policy in POLICIES.names() or load_preset(policy) is not None
        what = "is not selected" if known else "is not a known policy"
        raise ConfigError(f"{label} {policy}:{key}: policy {policy!r} {what}; the selected "
                          f"{'policies are' if len(selected) > 1 else 'policy is'} {', '.join(selected)} "
                          f"(add it to the selected policies, or drop the '{policy}:' prefix)")


def merge_policy_sets(policy_settings: Mapping[str, Any], selected: list[str],
                      items: list[tuple[str | None, str, Any]], *, simulation: bool = False,
                      origin: str = "--set") -> dict[str, Any]:
    """``policy_settings`` (keyed by policy; typed or mappings) with ``(policy or None, key, value)`` settings
    added, each policy's settings typed again.

    A key without a policy applies to every selected policy whose settings have that key, so
    ``--policy all --set cap_multiplier=2`` changes v2.5 only; when none has it, the one selected policy
    gets it (its validation names the key and the valid ones), or it is an error naming each policy's keys.
    A dotted key sets a nested setting (``v3:migration.stall_share``); an old spelling of a key still finds its
    policy (its validation warns, naming the new key) and overrides what it means. ``policy_settings`` were
    valid, so an error (or a warning) names ``origin``, where the items came from, not the policy's preset.
    """
    check_set_targets(items, selected)
    models = {name: policy_class(name, simulation=simulation)[0].config_model for name in selected}
    fields = {name: _keys(model) for name, model in models.items()}
    settings = dict(policy_settings)
    changed: dict[str, dict[str, Any]] = {}
    for policy, key, value in items:
        head = key.split(".", 1)[0]
        targets = [policy] if policy else [n for n in selected if head in fields[n]]
        if not targets and len(selected) == 1:
            targets = selected
        if not targets:
            known = ", ".join(f"{n}: {', '.join(sorted(models[n].model_fields)) or '(none)'}" for n in selected)
            raise ConfigError(f"policy setting {key!r} belongs to none of the selected policies; settings are {known}")
        for name in targets:
            item: dict[str, Any] = {}
            set_dotted(item, key, value)
            model = models.get(name) or policy_class(name, simulation=simulation)[0].config_model
            current = changed.get(name) or plain_settings(settings.get(name))
            if issubclass(model, ConfigModel):   # an old key: what it means now, over what it changes
                item = upgrade_section(model, item, source=origin, prefix=f"policy_settings.{name}", base=current)
            changed[name] = deep_merge(current, item)
    for name, merged in changed.items():   # typed again, naming the setting
        settings[name] = resolve_policy(name, merged, simulation=simulation, origin=origin)[1]
    return settings


def _keys(model: type) -> set[str]:
    """The top-level keys a settings model takes: its fields and, for a ``ConfigModel``, its old spellings."""
    return set(model.model_fields) | (model.old_keys() if issubclass(model, ConfigModel) else set())


def with_policy_sets(cfg: Any, items: list[tuple[str | None, str, Any]], selected: list[str] | None = None, *,
                     simulation: bool = False) -> Any:
    """A copy of ``cfg`` (a config with ``policy`` and ``policy_settings``) with ``items`` merged
    (:func:`merge_policy_sets`); ``selected`` defaults to the policies ``cfg.policy`` names."""
    if not items:
        return cfg
    names = selected if selected is not None else policy_names(cfg.policy)
    settings = merge_policy_sets(cfg.policy_settings, names, items, simulation=simulation)
    return cfg.model_copy(update={"policy_settings": settings})
