"""Multi-turn samples between turns: parked when a turn ends, holding no slot (unless ``hold_turn_slots``),
and continued with what their environment added."""

from __future__ import annotations

from typing import Callable, Sequence

from pdsr_sdk.dispatch.protocols import Engine
from pdsr_sdk.dispatch.scheduler.launch import Launcher
from pdsr_sdk.dispatch.scheduler.slots import Run
from pdsr_sdk.dispatch.types import Sample, TurnRecord
from pdsr_sdk.errors import PdsrError


class Turns(Launcher):
    """:meth:`continue_turn` and the parked samples (set by :meth:`_init_turns`)."""

    def _init_turns(self, on_turn_end: Callable[[Sample, str], None] | None, hold_turn_slots: bool) -> None:
        # a multi-turn sample's turn ended (None: multi-turn samples finish at their first turn's end)
        self._on_turn_end = on_turn_end
        # multi-turn samples between turns (waiting on their environment; no slot held) -> where their next
        # turn goes: (pool, engine), the engine that ran the last turn unless the policy moved the sample
        self._parked: dict[Sample, tuple[str | None, Engine | None]] = {}
        # hold_turn_slots: parked samples keep their engine's slot (a pseudo request id in _running_on) while they
        # wait; ``held_turn_slot_s`` adds up the slot-seconds so held (0 without it)
        self.hold_turn_slots = hold_turn_slots
        self._holding: dict[Sample, tuple[Engine, str, float]] = {}
        self.held_turn_slot_s = 0.0

    def parked(self) -> list[Sample]:
        """Multi-turn samples between turns (waiting on their environment)."""
        return list(self._parked)

    def continue_turn(self, sample: Sample, env_ids: Sequence[int] | int, max_tokens: int | None = None, *,
                      tool_name: str | None = None) -> None:
        """Run a parked multi-turn sample's next turn: ``env_ids`` (what its environment added since the model's
        last token; mask 0; a count for engines that count only) go into its response, then the model samples up
        to ``max_tokens`` more (None: up to the sample's ``max_tokens``). Queued first on the engine that ran its
        last turn (its prefix is cached there), or where the policy moved it while it waited or moves it now
        (``on_next_turn``)."""
        if sample not in self._parked:
            raise PdsrError(f"continue_turn: sample {sample.key} is not waiting between turns")
        self._release_held(sample)
        if self._wants_next_turn:
            home = self._parked[sample][1]
            if home is not None:
                self.guarded(self.policy.on_next_turn, sample, home)
        target = self._parked.pop(sample)
        now = self.clock.now()
        turns = sample.turns if sample.turns is not None else []
        n_env = env_ids if isinstance(env_ids, int) else len(env_ids)
        if n_env:
            last_end = turns[-1].end_s if turns else now
            turns.append(TurnRecord("environment", sample.num_generated, n_env, tool_name=tool_name,
                                    start_s=now if last_end is None else last_end, end_s=now))
            sample.add_env_tokens(env_ids)
        room = sample.max_tokens - sample.num_generated
        if room <= 0:
            raise PdsrError(f"continue_turn: sample {sample.key} has no tokens left ({sample.num_generated} of "
                            f"{sample.max_tokens}); finish it")
        sample.turn_end = sample.num_generated + (room if max_tokens is None else max(1, min(max_tokens, room)))
        pool, engine = target
        self._enqueue(sample, pool if pool is not None else (engine.pool if engine is not None else None), engine,
                      sample.cap, True, turn=True)
        self._pump()

    def _end_turn(self, run: Run, reason: str) -> None:
        """A multi-turn sample's turn ended (``stop``, or ``length``: the turn's or the sample's token limit): park
        it, holding no slot, until its owner continues or finishes it."""
        sample = run.sample
        sample.segments[-1].end_reason = reason
        if sample.turns:
            turn = sample.turns[-1]
            turn.end_s = self.clock.now()
            turn.finish_reason = reason
        sample.turn_end = None
        if run.intent is not None and run.intent[0] == "finish":
            self._finish(sample, run.intent[1])
            return
        if run.intent is not None and run.intent[0] == "queue":
            target: tuple[str | None, Engine | None] = (run.intent[1], run.intent[2])
        else:
            target = (run.stolen_from or run.engine.pool, run.engine)
        self._parked[sample] = target
        self.stats["turns"] += 1
        if self.hold_turn_slots and target[1] is run.engine and not self.usage[run.engine.name].dead:
            held = f"{sample.key}#held"
            self._take_slot(run.engine, held)
            self._holding[sample] = (run.engine, held, self.clock.now())
        if self._wants_parked:
            self.guarded(self.policy.on_turn_parked, sample, run.engine)
        assert self._on_turn_end is not None
        self._on_turn_end(sample, reason)

    def _release_held(self, sample: Sample) -> None:
        """``hold_turn_slots``: give back the slot a parked sample kept (counting the seconds it was held)."""
        held = self._holding.pop(sample, None)
        if held is not None:
            engine, rid, since = held
            self.held_turn_slot_s += self.clock.now() - since
            if rid in self._running_on.get(engine.name, ()):
                self._release_slot(engine, rid)
