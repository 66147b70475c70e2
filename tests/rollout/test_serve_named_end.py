"""A named sample that fails while a turn of it is asked for: the waiting request is a 409 naming the sample and
why it ended, whatever other samples and plain requests the server has finished meanwhile (fake engines)."""

from __future__ import annotations

import pytest

from support import requires_torch
from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.session import RolloutSession

openai = pytest.importorskip("openai")


@requires_torch
def test_a_named_sample_that_fails_in_a_turn_is_a_409_naming_it(tiny_model_dir):
    from serve_client import serving
    from turn_fakes import REFUSED_ID

    cfg = RolloutConfig(model=str(tiny_model_dir), policy="v3", sampling={"max_tokens": 64},
                        engines=[{"name": "f0", "pool": "fast", "backend": "turn_fakes:RefusingTurnEngine",
                                  "max_model_len": 256, "max_num_seqs": 4}])
    with RolloutSession(cfg) as session, serving(session) as (client, _):
        kept = {}
        for name in ("a", "b", "c"):   # named samples the server keeps, then plain requests it finishes
            kept[name] = client.completions.create(model="tiny", prompt=[5, 6], max_tokens=4,
                                                   extra_body={"pdsr_sample": name})
            assert len(client.completions.create(model="tiny", prompt=[7], max_tokens=2).choices[0].token_ids) == 2
        ids = [5, 6] + kept["b"].choices[0].token_ids + [REFUSED_ID]   # b's next turn: the engine refuses it
        with pytest.raises(openai.APIStatusError) as info:
            client.completions.create(model="tiny", prompt=ids, max_tokens=4, extra_body={"pdsr_sample": "b"})
        assert info.value.status_code == 409
        message = info.value.body["message"] if isinstance(info.value.body, dict) else str(info.value)
        assert "sample 'b' ended (failed" in message and f"token {REFUSED_ID} refused" in message
        ids = [5, 6] + kept["c"].choices[0].token_ids + [8]   # the others go on
        r = client.completions.create(model="tiny", prompt=ids, max_tokens=4, extra_body={"pdsr_sample": "c"})
        assert len(r.choices[0].token_ids) == 4
