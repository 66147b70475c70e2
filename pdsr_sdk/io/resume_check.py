"""The check of ``--resume`` that ``pdsr rollout`` and ``pdsr score`` share: a run continued with other settings
than those its files recorded is refused, naming the files, each setting that differs (its config key and flag)
and both values, and how to go on."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from pdsr_sdk.errors import ConfigError

#: what a setting that ``then`` lacks is shown as (with ``complete``)
UNRECORDED = "not recorded"


def check_resume_settings(where: str | Path, then: Mapping[str, Any], now: Mapping[str, Any],
                          flags: Mapping[str, str], *, complete: bool = False,
                          same: Callable[[str], bool] | None = None) -> None:
    """A ConfigError naming every setting of ``flags`` whose value ``then`` (recorded with the run in ``where``)
    differs from ``now`` (this run's), in the order of ``flags``, each ``key (flag) is <now> now but was <then>``.

    ``flags`` maps each config key to the flag that sets it (the key itself where none does). A key ``now`` lacks
    is not compared; nor is one ``then`` lacks (a run written before pdsr recorded it) unless ``complete`` (the run
    recorded every setting it had: a missing one differs, shown as ``not recorded``). Values compare as JSON reads
    them back (a tuple and a list alike, so do 1 and 1.0); ``same(key)``, where given, may say two values that
    differ as data are the same setting (policy settings spelt two ways)."""
    diffs = []
    for key, flag in flags.items():
        if key not in now:
            continue
        value = _plain(now[key])
        if key not in then:
            if complete:
                diffs.append(f"{key} ({flag}) is {value!r} now but was {UNRECORDED}")
        elif _plain(then[key]) != value and not (same is not None and same(key)):
            diffs.append(f"{key} ({flag}) is {value!r} now but was {_plain(then[key])!r}")
    if diffs:
        raise ConfigError(f"{where}: --resume continues a run made with other settings: {'; '.join(diffs)}. Resume "
                          f"with the run's settings (the values it was made with), or start over with --overwrite "
                          f"(which replaces it)")


def _plain(value: Any) -> Any:
    """``value`` as it reads back from JSON: tuples as lists, in dicts and lists too."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value
