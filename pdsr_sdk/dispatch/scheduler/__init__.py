"""The scheduler: queues, engine slots, segments, and the policy's command surface.

Single-threaded and IO-free: engines report progress through the
:class:`~pdsr_sdk.dispatch.protocols.EngineListener` methods, the policy is
called on events and answers with :class:`DispatchContext` commands, and time
comes from a clock. The same object runs real vLLM engines (on an asyncio
loop) and simulated ones (on a virtual clock).

A sample's life: queued (on a pool's or an engine's queue) -> running (one
segment on one engine) -> at the segment's end it finishes, continues on the
same engine, or goes back to a queue (moved, stolen back, or its engine died).

``pause(mode)`` stops launches until ``resume()`` (a trainer updating weights mid-step): ``abort``
aborts every running segment and holds its sample, tokens kept, to continue at resume; ``wait`` lets
running samples go on; ``keep`` leaves running requests where they are (the engine freezes them).

A multi-turn sample (``sample.turns`` set; an agent runs it) does not finish when a turn ends: it is
parked, holding no slot, and ``on_turn_end(sample, reason)`` tells its owner, who later either calls
:meth:`Scheduler.continue_turn` with what the environment added (the next turn queues first on the engine
that holds its prefix, unless the policy moved it meanwhile) or :meth:`Scheduler.finish` to end it. The policy
hears both (``on_turn_parked``, ``on_next_turn``: there it may still move the next turn). With
``hold_turn_slots`` (a reference for the simulator: what a framework that keeps the request through its
environment's wait takes) the parked sample keeps its slot until its next turn runs there.
"""

from __future__ import annotations

from pdsr_sdk.dispatch.scheduler.core import Scheduler
from pdsr_sdk.dispatch.scheduler.pause import PAUSE_MODES
from pdsr_sdk.dispatch.scheduler.slots import EngineUsage

__all__ = ["PAUSE_MODES", "EngineUsage", "Scheduler"]
