"""Base config model and loading with dotted-key errors."""

from __future__ import annotations

import contextlib
import copy
import json
import re
import warnings
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Mapping, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, model_validator

from pdsr_sdk.errors import ConfigError, ConfigValueError, PdsrDeprecationWarning, PdsrError

M = TypeVar("M", bound=BaseModel)

#: what an unknown key may be instead, by its dotted key as written (None: nothing to say). The SDK has no such
#: names: a front end sets one around its loading (the CLI, other tools' names for pdsr's settings), and a context
#: variable reaches the sections validators check several calls down (engine_defaults, policy_settings) as well
_UNKNOWN_KEY_HINT: ContextVar[Callable[[str], str | None] | None] = ContextVar("unknown_key_hint", default=None)


@contextlib.contextmanager
def unknown_key_hints(hint: Callable[[str], str | None]) -> Iterator[None]:
    """While inside, an unknown key's error adds ``hint(key)`` where it is not None, asked for the key and, where
    the key's value is a mapping, for each nested key under it (``actor_rollout_ref.rollout.n``)."""
    token = _UNKNOWN_KEY_HINT.set(hint)
    try:
        yield
    finally:
        _UNKNOWN_KEY_HINT.reset(token)


class ConfigModel(BaseModel):
    """Base of every pdsr config: unknown keys are errors; old key spellings work, with a warning."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    #: old top-level key -> its new name (still accepted, with a :class:`PdsrDeprecationWarning`)
    renamed_keys: ClassVar[dict[str, str]] = {}
    #: key of a removed feature -> what was removed and why. In a config written by hand it is an error naming
    #: the removal; in settings read back from a saved run (validation context ``{"saved": True}``,
    #: :func:`validate_saved`) it is dropped with a warning, so that an old run still resumes and compares
    removed_keys: ClassVar[dict[str, str]] = {}

    def __init__(self, /, **data: Any) -> None:
        """Built in Python (``SimulateConfig(fast=0)``): a bad value is a :class:`ConfigValueError` in
        pdsr's format (one line per key), not pydantic's ValidationError."""
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigValueError(format_validation_error(exc, type(self))) from None

    # pydantic calls a model's own __init__ for nested models and model_validate too; marked as the base
    # init, it is only called for direct construction, so nested errors keep their full dotted keys and
    # load_config/validate_config still get the ValidationError they format with the file's name.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def old_keys(cls) -> set[str]:
        """Top-level keys this model still accepts under an old spelling (or rejects by name as removed)."""
        return set(cls.renamed_keys) | set(cls.removed_keys)

    @model_validator(mode="before")
    @classmethod
    def _upgrade_old_keys(cls, data: Any, info: ValidationInfo) -> Any:
        saved = bool((info.context or {}).get("saved"))
        try:
            return cls.upgrade(data, saved=saved) if isinstance(data, dict) else data
        except ConfigError as exc:
            if info.context is None or isinstance(exc, ValueError):
                raise
            # read by load_config / validate_config: as a ValueError, so that the error names the file and the key
            # of the section it is in (pydantic's location), as every other error of the file does
            raise ConfigValueError(str(exc)) from None

    @classmethod
    def upgrade(cls, data: dict[str, Any], source: str | Path | None = None, *, saved: bool = False) -> dict[str, Any]:
        """``data`` with old key spellings moved to their new keys, warning once per old key; a key of a removed
        feature (``removed_keys``) is an error, or with ``saved`` (read back from a saved run) dropped with a
        warning."""
        data = dict(data)
        for old, why in cls.removed_keys.items():
            if old in data:
                if not saved:
                    raise ConfigError(f"{_origin(source)}{old}: {why}; remove the key")
                data.pop(old)
                warnings.warn(f"{_origin(source)}config key '{old}' of a saved run is ignored: {why}",
                              PdsrDeprecationWarning, stacklevel=2)
        for old, new in cls.renamed_keys.items():
            if old in data:
                if new in data:
                    raise ConfigError(f"{_origin(source)}{old} and {new} are the same setting ({old} is its old "
                                      f"name); keep {new} only")
                deprecated_key(old, new, source)
                data[new] = data.pop(old)
        return data

    @classmethod
    def upgrade_over(cls, base: Mapping[str, Any], data: dict[str, Any], source: str | Path | None = None, *,
                     saved: bool = False) -> dict[str, Any]:
        """:meth:`upgrade` for ``data`` about to be merged over ``base`` (settings already upgraded: a preset's
        under the given ones, those ``--set`` adds to), for an old key whose meaning depends on what it is
        merged onto. By default the same as :meth:`upgrade`."""
        return cls.upgrade(data, source, saved=saved)


def check_device(value: str, *, auto: bool = False) -> str:
    """``value`` if it names a torch device pdsr accepts: cpu, cuda, cuda:N (and auto, if allowed)."""
    kind, sep, index = value.partition(":")
    kinds = ("auto", "cpu", "cuda") if auto else ("cpu", "cuda")
    if kind not in kinds or (sep and (kind != "cuda" or not index.isdigit())):
        raise ConfigValueError(f"expected {'auto, ' if auto else ''}cpu, cuda or cuda:N, got {value!r}")
    return value


def deprecated_key(old: str, new: str, source: str | Path | None = None) -> None:
    """Warn that config key ``old`` is deprecated in favour of ``new`` (naming the file, if any)."""
    warnings.warn(f"{_origin(source)}config key '{old}' is deprecated; use '{new}'", PdsrDeprecationWarning,
                  stacklevel=3)


def _origin(source: str | Path | None) -> str:
    return f"{source}: " if source else ""


def read_config_file(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """Read a YAML (``.yaml``/``.yml``) or JSON config file into a dict (UTF-8, a byte-order mark skipped);
    ``what`` names the file in errors."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:   # a binary file, or another encoding: the line, not the codec's traceback
        from pdsr_sdk.io.json_rows import first_non_utf8, not_utf8

        raise ConfigError(f"{not_utf8(path, *(first_non_utf8(path) or (0, 0)))} ({what})") from None
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:  # noqa: BLE001 - parser errors vary by format
        raise ConfigError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys at the top level, got {type(data).__name__}")
    return data


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``data["a"]["b"] = value`` for ``dotted == "a.b"``, creating mappings on the way."""
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def load_config(
    model: type[M],
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    base: Mapping[str, Any] | None = None,
    origins: Mapping[str, str] | None = None,
) -> M:
    """Build ``model`` from ``base``, then the file at ``path``, then ``overrides``.

    ``overrides`` maps dotted keys to values; ``None`` values are skipped so
    unset CLI flags leave the file's value alone. ``origins`` names where an
    override came from (dotted key -> e.g. ``"--n"``) for the errors; an override
    it does not name is "command line".
    """
    data: dict[str, Any] = _deep_merge({}, dict(base or {}))
    if path is not None:
        found = read_config_file(path)
        if issubclass(model, ConfigModel):   # old keys are renamed before flags override the new ones
            found = model.upgrade(found, source=path)
        data = _deep_merge(data, found)
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    for key, value in given.items():
        set_dotted(data, key, value)
    try:   # (the context names the file to validators that read sections of their own: policy settings)
        return model.model_validate(data, context={"source": str(path) if path is not None else None})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, model, source=path, overrides=given,
                                                  origins=origins)) from None


def validate_config(model: type[M], data: Mapping[str, Any], *, source: str | Path | None = None,
                    prefix: str = "", saved: bool = False) -> M:
    """Validate a mapping (e.g. one section of a larger file) with pdsr's error format.

    ``prefix`` is the dotted key of the section, so errors name the full key. ``saved``: the mapping was read
    back from a saved run (a summary, a resumed run's metadata), where a removed feature's key is dropped with
    a warning instead of being an error (``ConfigModel.removed_keys``).
    """
    data = dict(data)
    if issubclass(model, ConfigModel):   # old keys warn naming the file (the validator cannot know it)
        data = upgrade_section(model, data, source=source, prefix=prefix, saved=saved)
    try:
        return model.model_validate(data, context={"saved": saved, "source": str(source) if source else None})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, model, source=source, prefix=prefix)) from None


def upgrade_section(model: type[ConfigModel], data: dict[str, Any], *, source: str | Path | None = None,
                    prefix: str = "", saved: bool = False, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``model.upgrade(data)`` (``upgrade_over(base, data)`` with a ``base``) for the section at dotted key
    ``prefix`` of a file: its errors name the key in full (``run.yaml: policy_settings.v3.disable: ...``)."""
    try:
        if base is None:
            return model.upgrade(data, source, saved=saved)
        return model.upgrade_over(base, data, source, saved=saved)
    except ConfigError as exc:
        lead, text = _origin(source), str(exc)
        if not prefix or not text.startswith(lead):
            raise
        raise ConfigError(f"{lead}{prefix}.{text[len(lead):]}") from None


def validate_saved(model: type[M], data: Mapping[str, Any], *, source: str | Path | None = None,
                   prefix: str = "") -> M:
    """:func:`validate_config` for settings read back from a saved run (``saved=True``)."""
    return validate_config(model, data, source=source, prefix=prefix, saved=True)


def format_validation_error(
    exc: ValidationError,
    model: type[BaseModel],
    *,
    source: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    prefix: str = "",
    origins: Mapping[str, str] | None = None,
) -> str:
    """One line per problem: ``<file>: <dotted.key>: <what was expected>``; for a key an override set,
    ``origins``' name for it (the flag) or "command line" in place of the file."""
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        key = ".".join(([prefix] if prefix else []) + loc) or "(top level)"
        if overrides and key in overrides:
            origin = (origins or {}).get(key, "command line")
        else:
            origin = str(source) if source else model.__name__
        if err["type"] == "extra_forbidden":
            hinted, rest = _hinted_keys(key, err.get("input"), _UNKNOWN_KEY_HINT.get())
            lines += [f"{origin}: {name}: unknown config key; {said}" for name, said in hinted]
            if rest:   # a key, or nested keys under it, that no hint names
                valid = _valid_keys(model, loc[:-1])
                hint = f"; valid keys here: {', '.join(valid)}" if valid else ""
                lines.append(f"{origin}: {key}: unknown config key{hint}")
        elif isinstance((err.get("ctx") or {}).get("error"), PdsrError):   # our validators' own message
            said = str(err["ctx"]["error"])
            if loc or prefix:
                lines.append(f"{origin}: {key}: {said}")
            else:   # a whole-model check names its keys itself: each gets the command's flag for it, and the
                # command line has no name to put first (the model's means nothing to its user)
                said = _with_flags(said, origins or {})
                lines.append(f"{source}: {said}" if source else said if overrides is not None else f"{origin}: {said}")
        else:
            got = err.get("input")
            shown = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
            message = str(err["msg"])
            if err["type"] == "value_error":   # a validator's plain ValueError (a policy's own settings model, say):
                # its words without pydantic's "Value error, ", and the value only where they do not give it already
                message = str((err.get("ctx") or {}).get("error", message))
                shown = "" if str(got) in message else shown
            lines.append(f"{origin}: {key}: {message}{shown}")
    return "invalid config:\n  " + "\n  ".join(lines)


def _with_flags(text: str, origins: Mapping[str, str]) -> str:
    """``text`` with the first mention of each key of ``origins`` (a command's flags) written ``key (--flag)``, as
    a key's own error names it."""
    for key, flag in sorted(origins.items(), key=lambda kv: -len(kv[0])):
        text = re.sub(rf"(?<![\w.<-]){re.escape(key)}(?![\w.>-]| \()", f"{key} ({flag})", text, count=1)
    return text


def _hinted_keys(key: str, value: Any, hint: Callable[[str], str | None] | None) -> tuple[list[tuple[str, str]], bool]:
    """``hint``'s answers for ``key`` or, where it has none and the value is a mapping, for the keys nested under it
    (dotted); and whether a key none answers is left (``key`` itself, or a nested one)."""
    said = hint(key) if hint is not None else None
    if said is not None:
        return [(key, said)], False
    if hint is None or not isinstance(value, Mapping) or not value:
        return [], True
    found: list[tuple[str, str]] = []
    rest = False
    for name, inner in value.items():
        more, left = _hinted_keys(f"{key}.{name}", inner, hint)
        found += more
        rest = rest or left
    return found, rest


def _valid_keys(model: type[BaseModel], loc: list[str]) -> list[str]:
    """Field names of the sub-model at ``loc`` (best effort; [] if not a model)."""
    current: Any = model
    for part in loc:
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        field = current.model_fields.get(part)
        if field is None:
            # a dict/list index: descend into the value type if it is a model
            current = _inner_model(current)
            continue
        current = _inner_model(field.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return sorted(current.model_fields)
    return []


def _inner_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def deep_merge(base: Mapping[str, Any], other: Mapping[str, Any]) -> dict[str, Any]:
    """A new mapping: ``base`` with ``other`` merged in (nested mappings merged key by key, the rest replaced)."""
    return _deep_merge(_deep_merge({}, base), other)


def _deep_merge(into: dict[str, Any], other: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in other.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)
    return into
