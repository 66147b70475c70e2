"""Settings of the ``v3`` policy: one nested model per rule, and one ``disable`` list for the rules' switches.

Each description says what a setting does and why its default; the measurements behind the defaults are in
docs/notes/v3-settings.md. The flat keys of earlier versions (``migrate: false``, ``migrate_stall_share``, ...)
still work: :meth:`V3Settings.upgrade` maps each to its nested key with a deprecation warning naming it
(:data:`FLAT_KEYS`, :data:`FLAT_SWITCHES`).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, ClassVar, Literal, Mapping, get_args

from pydantic import BaseModel, Field, TypeAdapter, ValidationError, field_validator, model_validator

from pdsr_sdk.config import ConfigModel
from pdsr_sdk.config.base import deprecated_key
from pdsr_sdk.errors import ConfigError, ConfigValueError, PdsrDeprecationWarning

#: the rules (and parts of rules) that ``disable`` may switch off
V3Rule = Literal["probes_first", "locality", "balance", "chunk_steal", "migration", "early_restart"]
RULES: tuple[str, ...] = get_args(V3Rule)
#: rules removed from v3 (issue 48's rule table, docs/notes/v3-rules.md) -> why; ``disable`` naming one is an error in a
#: config written by hand, and is dropped with a warning in settings read back from a saved run
REMOVED_RULES: dict[str, str] = {
    "lead_guard": "v3's move guard (lead_guard) was removed (it cost up to 3.4% on-policy at B = 128, on heavy, and "
                  "gained at most 0.1% anywhere)",
    "kv_admission": "v3's KV-aware admission (kv_admission, with placement.kv_budget) was removed (it acted only on "
                    "the KV-bound members, never gained on the workload family's median, and cost 2.0% on longcot "
                    "on-policy at B = 512)",
}


class RankingSettings(ConfigModel):
    """The ranked pool (:mod:`.ranking`): which waiting sample a free slot takes."""

    mode: Literal["auto", "always", "never"] = Field(
        "auto", description="Order waiting work by its group's longest finished sample (Seer's rank): 'auto' while "
                            "the measured probe/sibling correlation reaches min_correlation, 'always', or 'never' "
                            "(queue order). 'auto' because ranking by a probe that predicts nothing costs.")
    min_correlation: float = Field(
        0.3, ge=-1, le=1, description="Rank only while the correlation of log probe length with log sibling "
                                      "length (measured on finished groups) is at least this. Below 0.3 the rank "
                                      "was noise on the workload family and queue order was faster.")
    correlation_window: int = Field(
        1024, ge=16, description="(probe, sibling) length pairs the correlation is measured over, across batches. "
                                 "1024 pairs is about a B=128 batch's worth: enough for a stable estimate that "
                                 "still follows a change of workload.")
    min_pairs: int = Field(
        64, ge=2, description="Pairs needed before the correlation is trusted; until then work runs in queue "
                              "order, as in baseline. 64 pairs is ten groups of eight (seven pairs each).")

    @model_validator(mode="after")
    def _window_holds_min_pairs(self) -> "RankingSettings":
        if self.correlation_window < self.min_pairs:
            raise ConfigValueError(f"ranking.correlation_window ({self.correlation_window}) holds fewer pairs than "
                                   f"ranking.min_pairs ({self.min_pairs}) needs, so the correlation would never be "
                                   f"trusted and 'auto' would never rank: raise the window or lower min_pairs")
        return self


class LengthSettings(ConfigModel):
    """The length prior (:mod:`.lengths`): what a sample with no finished sibling is predicted to need."""

    history: int = Field(
        2048, ge=1, description="Finished lengths remembered across batches for the length prior and the tail "
                                "thresholds. 2048 holds a B=256 batch of eight: its quantiles are stable, and it "
                                "still follows a change of workload within a few batches.")


class PlacementSettings(ConfigModel):
    """Placement (:mod:`.placement`): where arriving groups go."""

    #: kv_budget went with KV-aware admission
    removed_keys: ClassVar[dict[str, str]] = {"kv_budget": REMOVED_RULES["kv_admission"]}

    mode: Literal["auto", "chunk", "deal"] = Field(
        "auto", description="'deal': the ranked pool, one sample at a time to the least loaded engine as slots "
                            "allow; 'chunk': baseline's contiguous chunks per engine; 'auto': deal a stream under a "
                            "staleness bound whose probe predicts, and a cold batch that queues, else chunk. Chunks "
                            "keep a group's prompt in one engine's prefix cache; the ranked pool wins where "
                            "staleness binds.")
    heavy_max_seqs: int | None = Field(
        None, ge=1, description="Run the heavy pool's engines with at most this many samples each ('auto' then "
                                "deals every group: a chunk cannot hold an engine back). None: the engine's own "
                                "limit, as every other engine, since no workload measured gained from a lighter "
                                "heavy pool.")

    @model_validator(mode="after")
    def _held_heavy_engines_are_dealt(self) -> "PlacementSettings":
        if self.mode == "chunk" and self.heavy_max_seqs is not None:
            raise ConfigValueError(f"placement.heavy_max_seqs ({self.heavy_max_seqs}) holds the heavy engines back "
                                   "only where samples are dealt one at a time; placement.mode 'chunk' hands each "
                                   "engine its whole chunk: use mode 'auto' or 'deal', or leave heavy_max_seqs unset")
        return self


class MigrationSettings(ConfigModel):
    """Migration (:mod:`.migration`): a tail sample moves early to a lighter engine, and again as one opens."""

    quantile: float = Field(
        0.9, ge=0, le=1, description="In a batch, a sample joins the tail once it has produced more tokens than "
                                     "this quantile of the finished lengths. 0.9: on the family's batches 0.97 was up "
                                     "to 2% slower on a member's median and at most 0.4% faster.")
    stream_quantile: float = Field(
        0.97, ge=0, le=1, description="The same in a stream (groups arriving across steps, partial rollout). 0.97: "
                                      "there 0.9 was mixed across the family and raised the partial shares.")
    cap_runner_share: float = Field(
        0.5, gt=0, le=1, description="A sample also joins the tail once it has produced more tokens than the "
                                     "shortest finished length past which at least this share of the finished "
                                     "samples ran to the response cap. 0.5: it then more likely than not runs to "
                                     "the cap, which the quantile cannot tell where many samples do.")
    min_gap: int = Field(
        4, ge=1, description="Move only to an engine running at least this many fewer samples than the source. A "
                             "move re-prefills the sample's context on the target, so a small difference does "
                             "not pay for it.")
    min_ratio: float = Field(
        0.5, ge=0, le=1, description="Move only to an engine running at most this fraction of the source's "
                                     "samples (and min_gap fewer). At half the load the moved sample's steps are "
                                     "clearly faster there.")
    stall_share: float = Field(
        0.25, ge=0, description="A target takes a moved sample while the prefill of the samples still arriving "
                                "there costs at most this share of what the move saves (prices learnt from the "
                                "engines' timings). 0.25 was fastest across the SmolLM2 trace, 64 engines and the "
                                "KV-bound member (0.1 held moves back, 0.5 let herds of moves stall targets).")
    kv_headroom: float = Field(
        0.1, ge=0, le=1, description="A target takes a moved sample only while its KV cache, with the moved context "
                                     "added, stays at least this share free; where the cache binds, a move into a "
                                     "nearly full one crowds out the target's own long samples. 0.1: on kv-bound, "
                                     "B=128, ten seeds, 0.986x baseline against 1.000x without (0.05-0.2 all gained).")


class LaneSettings(ConfigModel):
    """The tail lane (:mod:`.lane`): in a stream under a staleness bound, heavy engines kept light for runaways."""

    mode: Literal["auto", "always", "never"] = Field(
        "auto", description="'auto': a lane while groups stream in under a staleness bound (where the probe predicts, "
                            "from the first restarted runaway) and restarted runaways are seen to run away again "
                            "(recurrence); 'always'; 'never'. Within a batch, without a bound, before a restart or "
                            "where restarts draw fresh lengths the lane cost more capacity than it saved.")
    seqs: int = Field(
        48, ge=1, description="A lane engine holding a runaway admits new work only while it runs fewer samples "
                              "than this. 48 keeps its step time a few times below a full engine's.")
    quantile: float = Field(
        0.995, ge=0, le=1, description="A sample moves to the lane once it has produced more tokens than this "
                                       "quantile of the finished lengths. At migration's 0.97 the lane filled with "
                                       "samples that would have finished anyway.")
    engines: int | None = Field(
        None, ge=1, description="Heavy engines that serve as the lane (the first by name). None: every heavy "
                                "engine while the stream leaves slots free, one when it fills every slot, where a "
                                "lane engine is capacity the stream needs.")
    recurrence: float = Field(
        0.5, ge=0, le=1, description="'auto' keeps the lane only while at least this share of the runaways "
                                     "restarted for staleness run away again. A replay repeats every one (the lane "
                                     "pays); a fresh RL sample rarely does (the lane's light engines are lost).")
    evidence: int = Field(
        4, ge=1, description="Restarted runaways whose outcome must be known before recurrence decides; until "
                             "then only restarted runaways go to the lane. Four is the fewest that told replay "
                             "from fresh draws apart on the family's streams.")
    segment_tokens: int = Field(
        512, ge=0, description="In a stream under a staleness bound with the lane off, ask for segments of at least "
                               "this many tokens (0: the budget-aware length alone). There a segment's end buys "
                               "little and re-prefills the context's last partial block; 512 was faster on all "
                               "twelve seed-002-like streams, 1024 slower at B=128.")


class StepEndSettings(ConfigModel):
    """At a step's end (:mod:`.step_end`, partial rollout): which samples of carried groups to generate again."""

    restart_chance: float = Field(
        0.75, ge=0, le=1, description="With early_restart: restart a sample of a group in its last step whose "
                                      "chance of ending within the next step is below this. Unless a sample is "
                                      "likely to end, restarting now costs less than waiting; 0.75 and 1 were "
                                      "fastest, 0.75 with fewer partial tokens.")
    refresh_ratio: float | None = Field(
        None, ge=0, le=1, description="Regenerate under the new weights each finished sample of a carried group "
                                      "that ran at most this fraction of its longest-running sibling's time (each "
                                      "once). None (off): it trades step time for freshness, and with every slot "
                                      "full it costs throughput.")


# flat key of earlier versions -> its nested key (a section and a field)
FLAT_KEYS: dict[str, str] = {
    "rank": "ranking.mode", "min_correlation": "ranking.min_correlation",
    "correlation_window": "ranking.correlation_window", "min_pairs": "ranking.min_pairs",
    "history": "lengths.history",
    "stream_placement": "placement.mode",
    "heavy_max_seqs": "placement.heavy_max_seqs",
    "migrate_quantile": "migration.quantile", "cap_runner_share": "migration.cap_runner_share",
    "migrate_min_gap": "migration.min_gap", "migrate_min_ratio": "migration.min_ratio",
    "migrate_stall_share": "migration.stall_share",
    "tail_lane": "lane.mode", "lane_seqs": "lane.seqs", "lane_quantile": "lane.quantile",
    "lane_engines": "lane.engines", "lane_recurrence": "lane.recurrence", "lane_evidence": "lane.evidence",
    "stream_segment_tokens": "lane.segment_tokens",
    "early_restart_chance": "step_end.restart_chance",
}
# flat on/off key of earlier versions -> the rule ``disable`` names
FLAT_SWITCHES: dict[str, str] = {
    "probes_first": "probes_first", "locality": "locality", "balance": "balance",
    "chunk_steal": "chunk_steal", "migrate": "migration", "early_restart": "early_restart",
}


class V3Settings(ConfigModel):
    """Settings of the v3 policy: a section per rule, and the rules switched off."""

    #: a key of a rule removed from v3 -> what to say
    removed_keys: ClassVar[dict[str, str]] = {"migrate_lead_guard": REMOVED_RULES["lead_guard"],
                                              "kv_admission": REMOVED_RULES["kv_admission"],
                                              "kv_budget": REMOVED_RULES["kv_admission"]}

    disable: list[V3Rule] = Field(
        default_factory=list, description="Rules switched off, for A/B runs: probes_first, locality, balance, "
                                          "chunk_steal, migration, early_restart. None by default: each rule "
                                          "kept gains where it acts (docs/notes/v3-rules.md).")
    ranking: RankingSettings = Field(default_factory=RankingSettings, description="The ranked pool of waiting work.")
    lengths: LengthSettings = Field(default_factory=LengthSettings, description="The length prior and its history.")
    placement: PlacementSettings = Field(default_factory=PlacementSettings,
                                         description="Where arriving groups go.")
    migration: MigrationSettings = Field(default_factory=MigrationSettings,
                                         description="Moving a tail sample to a lightly loaded engine, and again where "
                                                     "a lighter one opens later.")
    lane: LaneSettings = Field(default_factory=LaneSettings,
                               description="The tail lane for runaways in a stream under a staleness bound.")
    step_end: StepEndSettings = Field(default_factory=StepEndSettings,
                                      description="Early restarts and refreshes at a partial-rollout step's end.")

    @field_validator("disable")
    @classmethod
    def _sorted(cls, rules: list[str]) -> list[str]:
        """One entry per rule, in a fixed order, so that equal settings compare and print equal."""
        return [r for r in RULES if r in rules]

    @classmethod
    def old_keys(cls) -> set[str]:
        return super().old_keys() | set(FLAT_KEYS) | set(FLAT_SWITCHES) | {"refresh", "refresh_ratio"}

    def on(self, rule: str) -> bool:
        """Whether ``rule`` (one of :data:`RULES`) is on (not listed in ``disable``)."""
        if rule not in RULES:
            raise ValueError(f"unknown v3 rule {rule!r}")
        return rule not in self.disable

    @classmethod
    def upgrade(cls, data: dict[str, Any], source: str | Path | None = None, *, saved: bool = False) -> dict[str, Any]:
        """Also the flat keys of earlier versions -> their nested keys, each with a warning naming the new key."""
        return cls.upgrade_over({}, data, source, saved=saved)

    @classmethod
    def upgrade_over(cls, base: Mapping[str, Any], data: dict[str, Any], source: str | Path | None = None, *,
                     saved: bool = False) -> dict[str, Any]:
        """:meth:`upgrade`, where a flat switch acts on what ``data`` is merged onto, as when each was a key of its
        own: ``migrate: false`` adds migration to ``base``'s ``disable`` (unless ``data`` gives its own list),
        ``refresh`` and ``refresh_ratio`` keep the other's value from ``base``."""
        data = super().upgrade(data, source, saved=saved)
        origin = f"{source}: " if source else ""
        disabled = data.get("disable")
        if isinstance(disabled, list) and any(r in REMOVED_RULES for r in disabled):
            for rule in [r for r in disabled if r in REMOVED_RULES]:
                if not saved:
                    raise ConfigError(f"{origin}disable: {rule!r}: {REMOVED_RULES[rule]}; remove it from the list")
                warnings.warn(f"{origin}disable: {rule!r} of a saved run is ignored: {REMOVED_RULES[rule]}",
                              PdsrDeprecationWarning, stacklevel=2)
            data["disable"] = [r for r in disabled if r not in REMOVED_RULES]
        if isinstance(data.get("placement"), str):          # the old flat ``placement: auto``
            deprecated_key("placement", "placement.mode", source)
            mode = data.pop("placement")
            _set_new(data, "placement.mode", mode, origin, "placement")
        flat = [k for k in data if k in FLAT_KEYS or k in FLAT_SWITCHES or k in ("refresh", "refresh_ratio")]
        if not flat:
            return data
        below = base.get("disable")
        disable = list(data["disable"] if "disable" in data else below if isinstance(below, list) else [])
        refresh = _switch(data.pop("refresh", None), "refresh", origin)
        refresh_ratio = data.pop("refresh_ratio", None)
        for old in flat:
            if old in ("refresh", "refresh_ratio"):
                continue
            value = data.pop(old)
            if old in FLAT_SWITCHES:
                rule = FLAT_SWITCHES[old]
                if _switch(value, old, origin) is False:
                    deprecated_key(old, f"disable: [{rule}]", source)
                    disable = [*disable, rule]
                else:
                    deprecated_key(old, f"disable (without {rule}: on is the default)", source)
                    disable = [r for r in disable if r != rule]
                data["disable"] = disable
                continue
            new = FLAT_KEYS[old]
            deprecated_key(old, new, source)
            _set_new(data, new, value, origin, old)
        if refresh is not None or refresh_ratio is not None:
            # refreshes were on with a ratio (default 1.0); each key given alone keeps the other's value below
            step_end = base.get("step_end")
            below_ratio = step_end.get("refresh_ratio") if isinstance(step_end, Mapping) else None
            on = refresh if refresh is not None else below_ratio is not None
            ratio = refresh_ratio if refresh_ratio is not None else below_ratio if below_ratio is not None else 1.0
            # the new key's value, not its name alone: a ratio there turns refreshes on, where the old ratio
            # given without 'refresh: true' did nothing
            new = f"step_end.refresh_ratio: {ratio}" if on else "step_end.refresh_ratio: null (refreshes off, as " \
                "'refresh' was; a ratio there turns them on)"
            for old, given in (("refresh", refresh), ("refresh_ratio", refresh_ratio)):
                if given is not None:
                    deprecated_key(old, new, source)
            _set_new(data, "step_end.refresh_ratio", ratio if on else None, origin,
                     "refresh" if refresh is not None else "refresh_ratio")
        return data


def _switch(value: Any, old: str, origin: str) -> bool | None:
    """An old on/off key's value read as its bool field read it (0, "no", "off" are false); None stays None."""
    if value is None:
        return None
    try:
        return bool(TypeAdapter(bool).validate_python(value))
    except ValidationError:
        raise ConfigError(f"{origin}{old}: expected true or false, got {value!r}") from None


def _set_new(data: dict[str, Any], new: str, value: Any, origin: str, old: str) -> None:
    """``data[section][field] = value`` for ``new == "section.field"``; an error if both spellings are given."""
    section, key = new.split(".")
    node = data.get(section)
    if node is None:
        node = data[section] = {}
    elif isinstance(node, BaseModel):   # a section given typed (in Python): what was set in it
        node = data[section] = node.model_dump(exclude_unset=True)
    if not isinstance(node, dict):
        return   # the nested key's own validation names the problem
    if key in node:
        raise ConfigError(f"{origin}{old} and {new} are the same setting ({old} is its old name); keep {new} only")
    node[key] = value
