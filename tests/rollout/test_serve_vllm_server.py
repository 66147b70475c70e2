"""What ``pdsr serve`` answers besides completions, against vLLM's own server code as the reference, on real vLLM
engines (CPU build, tiny model; one server for the module) with the ``openai`` client: the error bodies
(vLLM's ``create_error_response`` for the same error), in a stream too; ``/v1/models`` (vLLM's ``ModelCard``);
``/version``, ``/ping``. A failed session's answers are checked on fake engines (it cannot serve again)."""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus

import httpx
import pytest

from pdsr_sdk.errors import RunError
from support import WAIT_S, requires_torch, requires_vllm, serving

openai = pytest.importorskip("openai")

NAMES = ["tiny", "tiny-alias"]
MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def vserved(engine_loop, vllm_pair, tiny_model_dir):
    """``session.aserve`` on the shared real engines, answering to NAMES: (session, openai client, root URL)."""
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    session = RolloutSession(RolloutConfig(model=str(tiny_model_dir), sampling={"max_tokens": 8}), engines=vllm_pair)
    with serving(session, engine_loop, NAMES) as root:
        yield session, openai.OpenAI(base_url=f"{root}/v1", api_key="none", max_retries=0, timeout=WAIT_S), root


def vllm_body(error: str | Exception, **kw) -> dict:
    """vLLM's server's error body for ``error`` (a message, with ``kw`` as its server passes them, or an exception
    its server maps itself)."""
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

    return create_error_response(error, **kw).model_dump()


def stream_chunks(url: str, body: dict) -> list[str]:
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=WAIT_S) as r:
        assert r.status_code == 200
        return [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


@requires_vllm
@pytest.mark.vllm
@pytest.mark.slow
class TestOnVllmEngines:
    def test_a_bad_request_is_vllms_400(self, vserved):
        """pdsr's 400 was typed OpenAI's ``invalid_request_error``; vLLM's is ``BadRequestError``."""
        _, client, root = vserved
        r = httpx.post(f"{root}/v1/chat/completions", json={"messages": MSGS, "n": 0}, timeout=WAIT_S)
        assert r.status_code == 400 and "n must be a positive integer" in r.json()["error"]["message"]
        assert r.json() == vllm_body(r.json()["error"]["message"])
        with pytest.raises(openai.BadRequestError, match="n must be a positive integer"):
            client.chat.completions.create(model="tiny", messages=MSGS, n=0)

    def test_a_body_that_is_no_json_object_is_vllms_validation_400(self, vserved):
        """vLLM's request validation types these ``Bad Request`` and names the body (at the JSON error's
        position), where pdsr's said only invalid_request_error."""
        _, _, root = vserved
        bad = b'{"messages": ]'
        for raw, param in ((bad, f"body.{json_error_at(bad)}"), (b"[1]", "body")):
            r = httpx.post(f"{root}/v1/chat/completions", content=raw, timeout=WAIT_S,
                           headers={"content-type": "application/json"})
            error = r.json()["error"]
            assert (r.status_code, error["type"], error["param"], error["code"]) == (400, "Bad Request", param, 400)

    def test_a_bug_is_vllms_500_and_ends_a_stream_with_its_error(self, vserved, monkeypatch):
        """An unexpected exception was FastAPI's plain-text 'Internal Server Error' (and cut a stream off without
        its error chunk and [DONE]); vLLM's server answers it with its error body, in a stream as its last chunk."""
        from pdsr_sdk.rollout import serve_stream
        from pdsr_sdk.rollout.serve import ChatServer

        session, client, root = vserved

        def boom(*_):
            raise RuntimeError("boom: a bug")

        monkeypatch.setattr(ChatServer, "detokenize", boom)
        r = httpx.post(f"{root}/detokenize", json={"tokens": [5]}, timeout=WAIT_S)
        assert (r.status_code, r.json()) == (500, vllm_body(RuntimeError("boom: a bug")))
        monkeypatch.setattr(serve_stream._Choice, "tokens", boom)   # fails once the stream has begun
        lines = stream_chunks(f"{root}/v1/chat/completions", {"messages": MSGS, "max_tokens": 4})
        assert json.loads(lines[0])["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert (json.loads(lines[-2]), lines[-1]) == (vllm_body(RuntimeError("boom: a bug")), "[DONE]")
        monkeypatch.undo()
        assert client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2).choices   # serving on

    def test_engines_holding_a_partial_update_are_vllms_retryable_503(self, vserved):
        from vllm.exceptions import RetryableRequestError

        session, client, root = vserved
        session._weights_partial = "the engines had loaded up to 1 bucket(s) of this update"   # as a failed update
        try:
            r = httpx.post(f"{root}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=WAIT_S)
            assert (r.status_code, r.json()) == (503, vllm_body(RetryableRequestError(r.json()["error"]["message"])))
            assert "partial weight update" in r.json()["error"]["message"]
            with pytest.raises(openai.InternalServerError, match="partial weight update"):   # openai's 5xx
                client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2, stream=True)
        finally:
            session._weights_partial = None
        assert client.completions.create(model="tiny", prompt="x", max_tokens=2).choices

    def test_models_are_vllms_model_cards(self, vserved, tiny_model_dir):
        """pdsr's card had ``root`` the served name, ``owned_by`` pdsr and no ``permission``; vLLM's ``root`` is
        the model as given (its --model), for each served name."""
        from vllm.entrypoints.serve.engine.protocol import ModelCard, ModelList, ModelPermission

        session, client, root = vserved
        listed = httpx.get(f"{root}/v1/models", timeout=WAIT_S).json()
        assert ModelList.model_validate(listed).model_dump(exclude={"data"}) == {"object": "list"}
        context = min(e.spec.max_model_len for e in session.engines)
        default = ModelPermission().model_dump(exclude={"id", "created"})
        for card, name in zip(listed["data"], NAMES, strict=True):
            assert set(card) == set(ModelCard.model_fields)
            expect = ModelCard(id=name, root=str(tiny_model_dir), max_model_len=context).model_dump(
                exclude={"created", "permission"})
            assert {k: card[k] for k in expect} == expect
            [perm] = card["permission"]
            assert set(perm) == set(ModelPermission.model_fields) and perm["id"].startswith("modelperm-")
            assert {k: perm[k] for k in default} == default
        assert [m.root for m in client.models.list().data] == [str(tiny_model_dir)] * 2

    def test_version_and_ping_are_vllms(self, vserved):
        """Clients ask ``/version`` which vLLM they talk to, and SageMaker-style probes ``/ping``: pdsr had
        neither (a 404)."""
        import vllm

        _, _, root = vserved
        assert httpx.get(f"{root}/version", timeout=WAIT_S).json() == {"version": vllm.__version__}
        for method in ("GET", "POST"):
            r = httpx.request(method, f"{root}/ping", timeout=WAIT_S)
            assert (r.status_code, r.content) == (200, b"")

    def test_a_route_not_served_is_typed_as_vllm_types_an_http_error(self, vserved):
        _, client, root = vserved
        for method, path, status in (("GET", "/v1/models/tiny", 404), ("GET", "/v1/completions", 405)):
            r = httpx.request(method, f"{root}{path}", timeout=WAIT_S)
            error = r.json()["error"]
            assert (r.status_code, error["type"], error["code"]) == (status, HTTPStatus(status).phrase, status)
            assert "GET /version" in error["message"]
        with pytest.raises(openai.NotFoundError, match="/v1/models/tiny"):
            client.models.retrieve("tiny")


def json_error_at(raw: bytes) -> int:
    try:
        json.loads(raw)
    except json.JSONDecodeError as exc:
        return exc.pos
    raise AssertionError(f"{raw!r} is JSON")


@requires_torch
def test_a_failed_session_is_unhealthy_and_answers_vllms_500(tiny_model_dir):
    """A session a fatal error ended (a policy's exception, a pool's last engine lost) refuses every call, but its
    server still answered /health with a 200 and took requests; vLLM's server with its engine dead answers /health
    (and /ping) with a 503 and a request with its 500."""
    from serve_client import serving

    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    cfg = RolloutConfig(model=str(tiny_model_dir), policy="v3", sampling={"max_tokens": 8},
                        engines=[{"name": "f0", "pool": "fast", "backend": "turn_fakes:TurnEngine",
                                  "max_model_len": 256, "max_num_seqs": 4}])
    with RolloutSession(cfg) as session, serving(session, model_name="m") as (client, base):
        root = base.removesuffix("/v1")
        assert client.completions.create(model="m", prompt="x", max_tokens=2).choices
        assert httpx.get(f"{root}/health", timeout=WAIT_S).status_code == 200

        async def fail():
            session._set_fatal(RunError("pool 'fast' lost its last engine"))

        asyncio.run_coroutine_threadsafe(fail(), session._thread.loop).result(WAIT_S)
        for probe in ("health", "ping"):
            r = httpx.get(f"{root}/{probe}", timeout=WAIT_S)
            assert (r.status_code, r.content) == (503, b"")
        with pytest.raises(openai.InternalServerError, match="pool 'fast' lost its last engine") as refused:
            client.completions.create(model="m", prompt="x", max_tokens=2)
        error = refused.value.body
        assert (error["type"], error["code"]) == ("InternalServerError", 500)
