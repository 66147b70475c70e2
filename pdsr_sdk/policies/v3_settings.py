"""Settings of the ``v3`` policy (:mod:`pdsr_sdk.policies.v3`): one field per rule, each with the reason
for its default (the measurements are in docs/benchmarks.md and docs/notes/)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from pdsr_sdk.config import ConfigModel


class V3Settings(ConfigModel):
    """Settings of the v3 policy."""

    renamed_keys: ClassVar[dict[str, str]] = {"stream_placement": "placement"}

    probes_first: bool = Field(
        True, description="Launch sample 0 of every group before the others, so that each group's rank is "
                          "learnt early (no sample waits for a probe), until the probe is measured to predict "
                          "nothing (rank 'auto' below min_correlation): then groups run in queue order, as in "
                          "baseline (probes first cost 0.3% there on average, up to 0.8%).")
    rank: Literal["auto", "always", "never"] = Field(
        "auto", description="Order waiting work by its group's longest finished sample (Seer's rank): 'auto' "
                            "while the measured probe/sibling correlation reaches min_correlation, 'always', or "
                            "'never' (queue order: probes, then groups in batch order).")
    min_correlation: float = Field(
        0.3, ge=-1, le=1, description="Rank groups by their longest finished sample only while the correlation of "
                                      "log probe length with log sibling length (measured on finished samples) is "
                                      "at least this; below it the rank is noise and work runs in queue order.")
    correlation_window: int = Field(
        1024, ge=16, description="(probe, sibling) length pairs the correlation is measured over (across batches).")
    min_pairs: int = Field(
        64, ge=2, description="Pairs needed before the correlation is trusted (until then work runs in queue order).")
    kv_admission: bool = Field(
        True, description="Admit new work on an engine only while the predicted KV demand of what it runs leaves "
                          "room (real reasoning RL is memory-bound; a preempted request is recomputed).")
    kv_budget: float = Field(
        1.5, gt=0, description="Admit while the predicted final KV demand of an engine's running samples, plus the "
                               "new one's, stays within this multiple of its KV capacity. Above 1: samples finish at "
                               "different times and hold on average about half their final length over their lives, "
                               "so the true peak stays well below the sum of final lengths, and a sample held back "
                               "for room starts late (a late-started 32k-token runaway set the batch's end). KV-bound "
                               "family, 8 engines, B=128, twenty draws: median 0.932x / 0.913x baseline at 1.5 against "
                               "0.949x / 0.927x at 1.0, faster in 18 of 20, preemptions 270 against 174 (baseline "
                               "1,834); B=512, six draws: 0.900x against 0.928x, 6 of 6, preemptions 33k against 10k "
                               "(baseline 77k); 1.75 and 2.0 were no faster and preempted more (docs/benchmarks.md).")
    history: int = Field(
        2048, ge=1, description="Finished lengths remembered across batches for the length prior (a sample of a "
                                "group with no finished sample is predicted at their mean).")
    migrate: bool = Field(
        True, description="Move a long-running sample once, at a segment boundary, to a lightly loaded engine "
                          "when nothing waits.")
    migrate_min_gap: int = Field(
        4, ge=1, description="Move only when the target engine runs at least this many fewer samples than the "
                             "source (a move re-prefills the sample's context on the target).")
    migrate_min_ratio: float = Field(
        0.5, ge=0, le=1, description="... and at most this fraction of the source's samples.")
    migrate_stall_share: float = Field(
        0.25, ge=0, description="An engine takes a moved sample while the prefill of the samples moved to it that have not "
                               "yet ended their first segment there, this one included, costs at most this share of "
                               "what the move saves: the sample's expected remaining tokens (the mean of the finished "
                               "lengths beyond what it has produced, less that) times the difference of the source's "
                               "and the target's decode step. Else the next best target is tried; one moved sample at a "
                               "time while the prices are unmeasured. A move re-prefills the sample's whole context on "
                               "the target, which stalls every sample the target runs, and long samples reach the cap "
                               "together: an engine whose own freed its slots at once drew herds of nearly finished "
                               "samples (30 at 977-1011 of 1,024 tokens onto one engine, whose 0.6 s of prefill then set "
                               "the batch's end). The prices are learnt from the engines' timings (a decode step from "
                               "spans that continue on their engine, a context token's prefill from a moved sample's "
                               "wait for its first token), since the stall's weight varies with model and hardware: a "
                               "count limit (8 moved samples) cost 1.8% where a prefill token costs 0.78 ms (SmolLM2 "
                               "on a CPU), and a limit in the target's own steps held moves back where engines are "
                               "many and light. 0.25: SmolLM2 GSM8K trace, 8 engines, B=128, 10 draws, 0.979x "
                               "baseline (0.977x at 0.5, 0.983x at 0.1); 64 engines, B=512, uninformative family, "
                               "0.970x (0.966x at 0.5, 0.979x at 0.1); KV-bound 8 x 128 0.937x (0.947x at 0.5) "
                               "(docs/benchmarks.md).")
    migrate_lead_guard: bool = Field(
        True, description="A move does not land on an engine whose furthest-along sample is expected to run longer than the "
                          "moved one (each sample's expected remaining tokens from the history's finished lengths beyond "
                          "what it has produced): that sample, not the moved one, then sets the target's end, and the "
                          "move's prefill and added load would slow it. Where lengths run to a cap the furthest-along "
                          "sample has the least left, so moves still even out the engines' cap runners. 8 engines, "
                          "B=128, 10 draws, 3 batches: uninformative family 0.974x -> 0.968x baseline, SmolLM2 GSM8K trace "
                          "0.979x -> 0.975x (0.986x -> 0.979x under its CPU calibration), KV-bound 0.937x -> 0.927x. "
                          "While the history is not full and no finished sample has run to the cap, it holds only the "
                          "first, short finishes and cannot tell what a long-running sample has left: the one further "
                          "along then counts as having more left (as much again as it has produced, up to the cap). "
                          "That keeps a cold batch's runaways off one engine: KV-bound 8 x 128, two sets of ten draws, "
                          "worst draw 1.043x -> 1.004x and 1.035x -> 0.982x baseline (docs/benchmarks.md).")
    migrate_quantile: float = Field(
        0.97, ge=0, le=1, description="A sample moves only once it has produced more tokens than this quantile of "
                                     "the finished lengths in the history (it is then likely in the tail).")
    cap_runner_share: float = Field(
        0.5, gt=0, le=1, description="A sample also counts as in the tail (as past migrate_quantile) once it has produced "
                                     "more tokens than the shortest finished length past which at least this share of "
                                     "the finished samples ran to the response cap: it then more likely than not runs "
                                     "to the cap. Where many run to the cap (a small model that rambles: 40%) the "
                                     "quantile is the cap itself and nothing moved after a cold batch; `pdsr trace "
                                     "synth --prompt-sigma 0.05 --noise-sigma 0.7 --runaway-frac 0.35 "
                                     "--runaway-concentration 5 --max-length 1024`, 8 engines, B=128, 3 batches, seeds "
                                     "12-14: 0.959/0.963/0.982x baseline against 0.975/0.992/0.994x "
                                     "(docs/benchmarks.md).")
    balance: bool = Field(
        True, description="When the last waiting samples are handed out, an engine takes no more than its share "
                          "(by slots) of the batch's unfinished work, so that no engine's tail is crowded.")
    tail_lane: Literal["auto", "always", "never"] = Field(
        "auto", description="A tail lane on the heavy pool (lane_engines): a runaway (a sample past lane_quantile, also "
                            "after a restart) moves once per generation to the lane engine with the fewest runaways, "
                            "and a lane engine that holds one admits new work only up to lane_seqs, so runaways run "
                            "on lightly loaded engines. "
                            "'auto': on while groups arrive as others still run (partial rollout across steps) under "
                            "a staleness bound (max_staleness): new work never stops there and a runaway "
                            "would run at full load until it grows too stale; within one batch, or with no "
                            "staleness bound, the lane costs more capacity than it saves (docs/benchmarks.md); "
                            "and only while restarted runaways are seen to run away again (lane_recurrence).")
    lane_seqs: int = Field(
        48, ge=1, description="A lane engine holding a runaway admits new work only while it runs fewer samples "
                              "than this (its step time stays a few times below a full engine's).")
    lane_quantile: float = Field(
        0.995, ge=0, le=1, description="A sample moves to the tail lane once it has produced more tokens than this "
                                       "quantile of the finished lengths: the lane is for the few runaways that cannot "
                                       "finish within the staleness bound at full load (at migrate_quantile's 0.97 it "
                                       "filled with samples that would have finished anyway: seed 7, B=512, step 0.676x "
                                       "against 0.646x of on-policy; docs/benchmarks.md).")
    lane_engines: int | None = Field(
        None, ge=1, description="Heavy engines that serve as the tail lane (the first by name). None: every heavy engine "
                                "while the stream leaves slots free, one when it fills every slot (there a lane engine "
                                "is capacity the stream needs: two cost 0.677x against one's 0.646x at B=512).")
    lane_recurrence: float = Field(
        0.5, ge=0, le=1, description="'auto' keeps the tail lane only while at least this share of the runaways "
                                     "restarted for staleness run away again (once lane_evidence of them are known). "
                                     "A length-controlled replay repeats every one, and there the lane keeps a "
                                     "restarted runaway from growing too stale twice; a fresh RL sample rarely runs "
                                     "away again, and there the lane's light engines are capacity lost. Until the "
                                     "verdict is in, only restarted runaways go to the lane: where the stream leaves "
                                     "slots free a first-generation one could not make its window there either "
                                     "(B=128: about 45 s against 37 s), and where it fills every slot the lane's "
                                     "engine is capacity a fresh draw does not need. Seed-002-like streams, F=0.25, "
                                     "S=2, restarts drawing fresh lengths: B=128 0.406-0.418x of on-policy (baseline "
                                     "0.408-0.420x), where the lane from the start gave 0.436-0.448x; B=512 "
                                     "0.638-0.656x (baseline 0.640-0.665x, the lane from the start 0.649-0.669x); "
                                     "replayed restarts: B=128 0.450-0.462x (0.449-0.467x before the verdict), B=512 "
                                     "0.663-0.686x (baseline 0.686-0.720x) (docs/benchmarks.md).")
    lane_evidence: int = Field(
        4, ge=1, description="Restarted runaways whose outcome (ran away again, or finished short of the lane "
                             "threshold) must be known before lane_recurrence decides.")
    locality: bool = Field(
        True, description="In a stream, or while the rank is off, a free slot takes a waiting sibling of a group already "
                          "on its engine before the top-ranked sample (once the probes are out): the sibling finds its "
                          "prompt in that engine's prefix cache (seed-002-like streams, F=0.25, S=2: B=512 0.643-0.656x "
                          "against 0.656-0.667x without; B=128 0.439-0.466x against 0.451-0.466x). Within a batch whose "
                          "probe predicts, the rank stays strict: a hard group's long samples are better spread.")
    placement: Literal["auto", "chunk", "deal"] = Field(
        "auto", description="How arriving groups are placed. 'deal': v3's ranked pool, one sample at a time to the "
                            "least loaded engine as slots and KV allow. 'chunk': baseline's split, each arrival's "
                            "samples in contiguous chunks per engine, whatever the engines already run. 'auto': chunk "
                            "while the probe is measured to predict nothing (min_correlation), in a stream until "
                            "it is measured to predict or when it has no staleness bound, and a batch whose KV cache "
                            "does not bind (the predicted KV demand of what can run at once fits; always before any "
                            "length has been seen). Where every sample starts at once, order is moot, and dealing lost "
                            "up to 3-11% on some draws (informative family, 8 engines, B=128: worst draw 1.004x "
                            "baseline chunked against 1.033x dealt, median 0.987x against 0.981x); where the batch "
                            "queues for slots, chunks kept work-conserving by chunk_steal beat dealing (B=512, ten "
                            "draws: 0.964x, worst 1.000x, against 0.981x, worst 1.015x; real CPU engines of "
                            "bench/rollout.py 1.029x baseline over six pairs, within their run-to-run spread of "
                            "the 1.034x dealt). Deal where the KV cache binds: KV-aware "
                            "admission needs the ranked pool, and its engines then take their own groups' siblings "
                            "first. Chunks keep a "
                            "group on one engine, where vLLM's prefix cache serves its prompt once (dealt groups pay "
                            "it on every engine: uninformative family, 8 engines, 4 batches, seeds 12-14: B=128 "
                            "1.005x baseline dealt against 0.993x now, B=512 1.017x against 0.999x; a stream "
                            "without a bound, seed-002-like lengths (seed 1), B=512, F=0.25: 0.641x dealt, 0.628x chunked, "
                            "baseline 0.630x). In a stream chunks also leave the engines that hold carried work "
                            "slower, so the others complete their groups first (dealing keeps every engine equally "
                            "loaded: when lengths carry no signal every group then finishes at the same moment and "
                            "over-provision buys nothing). Under a staleness bound the tail lane and the ranked order "
                            "win (seed 7, B=512, F=0.25, S=2: 0.656x dealt against 0.811x chunked).")
    chunk_steal: bool = Field(
        True, description="Where arriving groups go in baseline's chunks (placement), an engine with free slots and "
                          "nothing queued takes whole unstarted groups from the end of the most-queued engine's chunk "
                          "(up to half of it): chunks keep a queue per engine, which is not work-conserving. Counted as "
                          "steals, not moves: nothing was generated, and a group keeps its prompt on one engine.")
    stream_segment_tokens: int = Field(
        512, ge=0, description="In a stream under a staleness bound with the tail lane off (the runaways restarted so far "
                               "did not run away again), ask for segments of at least this many tokens (at most the "
                               "segments' L_max; 0: the budget-aware length alone). At full load the budget-aware "
                               "length is 64 tokens, and each segment's end re-prefills the context's last partial "
                               "block, while there a segment's end buys v3 little. With the lane on, every end stays a "
                               "chance to move a runaway there; without a bound the drain's moves need them. "
                               "Seed-002-like streams, F=0.25, S=2, restarts drawing fresh lengths, six traces: B=512 "
                               "0.629-0.647x of on-policy against 0.638-0.656x at 0, B=128 0.400-0.437x against "
                               "0.406-0.444x, faster on all twelve; 1024 was slower at B=128, a floor for every sample "
                               "but restarted ones slower there too; replayed restarts keep the lane, unchanged "
                               "(docs/benchmarks.md).")
    early_restart: bool = Field(
        True, description="Partial rollout under a staleness bound, where the stream fills every slot: at a step's start, "
                          "restart a running sample of a group in its last step (its oldest tokens would be too stale "
                          "at the next) that is unlikely to end within that step (early_restart_chance), instead of "
                          "at the step's end, when its finished siblings would be restarted with it. It counts as its "
                          "one staleness restart. Not in a group whose finished siblings ran longer than a step's "
                          "tokens (its fresh draw may not end in time either), and not once the runaways restarted "
                          "so far are seen to run away again (a replay repeats them; a fresh RL sample rarely does). "
                          "Before that verdict it may: a stream's first groups reach their last step before any "
                          "restart was seen. Seed-002-like "
                          "streams, B=512, S=2, KV kept, K=10, the search within 10% partial tokens, nine traces: "
                          "0.591-0.614x of on-policy (twenty-two: 0.591-0.615x), 0.614-0.635x without early restarts "
                          "when first measured; K=20, F=0.25, six traces: mean 0.6025x of on-policy, 0.607x before "
                          "the odds counted running samples, 0.610x while early restarts waited for the verdict "
                          "(docs/benchmarks.md). B=128 leaves slots free: unchanged.")
    early_restart_chance: float = Field(
        0.75, ge=0, le=1, description="With early_restart: restart a sample whose chance of ending within the next step "
                                      "is below this: of the lengths that finished past what it has produced in the "
                                      "last four steps, of the samples restarted with more then (most runaways never "
                                      "finish under a bound) and of those still running with more (early in a stream "
                                      "only short lengths can have finished), the share that ended within the tokens a "
                                      "sample made in the last step (its 90th percentile). Unless a sample is likely to end, its "
                                      "restart now costs less than waiting: its fresh draw mostly ends within the "
                                      "step, and a miss restarts its siblings and holds a later step. K=20, F=0.25, "
                                      "six seed-002-like traces, mean steady step / on-policy: 0.25 0.6107x, 0.5 "
                                      "0.6063x, 0.75 0.6025x, 1 0.6015x (10.0% partial tokens against 9.9%) "
                                      "(docs/benchmarks.md).")
    refresh: bool = Field(
        False, description="Partial rollout: at a step's end, generate again under the new weights the finished samples "
                           "of each carried group that ran no longer than refresh_ratio x the longest time a "
                           "still-running sibling has run, so that the group is consumed with fresh samples instead "
                           "of responses a version old; each sample at most once; the thrown-away tokens count as "
                           "wasted. Off by default: it trades step time for freshness (numbers in "
                           "docs/benchmarks.md), and with every slot full it costs throughput.")
    refresh_ratio: float = Field(
        1.0, ge=0, le=1, description="With refresh: regenerate a finished sample of a carried group only if it ran at "
                                     "most this fraction of the time its longest-running sibling has run so far (that "
                                     "sibling needs at least that long, so the regenerated one rarely delays the "
                                     "group); lower values trade less step time for less freshness.")
    heavy_max_seqs: int | None = Field(
        None, ge=1, description="Run the heavy pool's engines with at most this many samples each (none: the "
                                "engine's own limit, as every other engine).")
