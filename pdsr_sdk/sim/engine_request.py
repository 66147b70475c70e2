"""A request on a simulated engine (:class:`SimRequest`) and its states: what
:class:`~pdsr_sdk.sim.engine.SimEngine` and its step boundaries keep of each one."""

from __future__ import annotations

#: a request's state: queued for admission, in the running batch, aborted (it leaves the batch at the next step
#: boundary), gone
WAITING, RUNNING, LEAVING, GONE = 0, 1, 2, 3


class SimRequest:
    """One request (a segment of a sample) on a simulated engine."""

    __slots__ = ("rid", "sample", "ctx", "max_tokens", "done", "s_adm", "off", "seq", "state", "prefill", "prompt",
                 "first_t", "ckey", "adm", "spec", "sib")

    def __init__(self, rid: str, sample, ctx: int, max_tokens: int, prompt, salt: str | None = None):
        self.rid = rid
        self.sample = sample
        self.prompt = prompt      # the prompt's identity for the prompt cache (None: not shared)
        # its sample's key in the prefix cache: blocks cached under another salt are not found
        self.ckey = sample if salt is None else (sample, salt)
        self.ctx = ctx            # context (prompt + generated) when last admitted / now if waiting
        self.max_tokens = max_tokens
        self.done = 0             # tokens of this segment generated before its current admission
        self.s_adm = 0            # global step at which it was (last) admitted
        self.off = 0              # ctx - s_adm: its context at global step S is S + off
        self.seq = 0              # admission number (running order; heap entries of older admissions are stale)
        self.state = WAITING
        self.prefill = 0          # uncached tokens prefilled at its admission
        self.first_t = None       # when the step that prefilled it (and sampled its first token) ended
        self.adm = (0.0, 0.0, 0.0)   # the engine's speculation sums (SimEngine._cum) at its last admission
        self.spec = (0.0, 0.0, 0.0)  # its own, before its current admission: drafting steps, accepted, drafted
        self.sib = 0                 # its sample's siblings finished when it was submitted (their draft corpus)
