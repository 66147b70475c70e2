"""The HTTP layer of ``pdsr serve`` (FastAPI, imported only when serving): OpenAI's routes over
:class:`~pdsr_sdk.rollout.serve.ChatServer`, and pdsr's named-sample routes. A ``stream=true`` request is
answered as Server-Sent Events of its tokens as they are made (:mod:`pdsr_sdk.rollout.serve_stream`)."""

# no `from __future__ import annotations`: FastAPI reads the routes' annotations (Request, imported lazily in
# create_app) as objects
from http import HTTPStatus
from typing import Any

from pdsr_sdk.rollout.serve import ChatServer
from pdsr_sdk.rollout.serve_error import ServeError, error_body, internal_error
from pdsr_sdk.rollout.serve_model import vllm_version
from pdsr_sdk.rollout.serve_options import stream_usage


def create_app(server: ChatServer) -> Any:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse

    from starlette.exceptions import HTTPException

    app = FastAPI(title="pdsr", docs_url=None, redoc_url=None)

    def error(exc: ServeError) -> JSONResponse:
        return JSONResponse(error_body(exc), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def routing_error(request: Request, exc: HTTPException) -> JSONResponse:
        # a route or method pdsr does not serve: an error body whose message lists the routes (vLLM's is Starlette's
        # {"detail": ...}), typed as vLLM types an HTTPException: the status's phrase
        return error(ServeError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}; pdsr serves "
                                                 f"POST /v1/chat/completions, POST /v1/completions, GET /v1/models, "
                                                 f"POST /tokenize, POST /detokenize, GET /health, GET /ping, "
                                                 f"GET /version and /v1/pdsr/samples/ID",
                                kind=HTTPStatus(exc.status_code).phrase))

    @app.exception_handler(ServeError)
    async def refused(request: Request, exc: ServeError) -> JSONResponse:
        return error(exc)   # every route's refusal (a bad body, an unknown model, a failed session): its status

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        return error(internal_error(exc))   # as vLLM's server answers one, not a plain-text 500

    async def body_of(request: Request) -> dict[str, Any]:
        # typed and named as vLLM's validation of a request body answers them ("Bad Request", param body)
        try:
            body = await request.json()
        except ValueError as exc:
            at = getattr(exc, "pos", None)
            raise ServeError(400, f"the request body is not JSON ({exc})", kind="Bad Request",
                             param="body" if at is None else f"body.{at}") from None
        if not isinstance(body, dict):
            raise ServeError(400, "the request body must be a JSON object", kind="Bad Request", param="body")
        return body

    async def answer(request: Request, call: Any) -> Any:
        """``call(body, sample_id, stream)``'s response, as JSON or, for ``stream=true``, as the events of its
        tokens as they come."""
        body = await body_of(request)
        usage = stream_usage(body)   # checked before the request runs
        response = await call(body, request.headers.get("x-pdsr-sample"), usage)
        if usage is None:
            return response
        return StreamingResponse(response, media_type="text/event-stream")

    @app.get("/health")
    async def health() -> Any:
        # vLLM's readiness probe, which launch scripts poll before their first request: 200 once serving, 503 (no
        # body, as vLLM's with its engine dead) once the session failed and answers no request
        return Response(status_code=200 if server.refusal() is None else 503)

    @app.api_route("/ping", methods=["GET", "POST"])
    async def ping() -> Any:
        return await health()   # vLLM's (SageMaker's) name for /health

    @app.get("/version")
    async def version() -> Any:
        return vllm_version()

    @app.get("/v1/models")
    async def models() -> Any:
        return server.models()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        return await answer(request, server.chat)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await answer(request, server.completions)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Any:
        return server.tokenize(await body_of(request))

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Any:
        return server.detokenize(await body_of(request))

    # :path: an ID may hold "/" (run/env/3), which the client sends as it is or as %2F
    @app.get("/v1/pdsr/samples/{sample_id:path}")
    async def sample(sample_id: str) -> Any:
        return await server.sample_row(sample_id)

    @app.post("/v1/pdsr/samples/{sample_id:path}/end")
    async def end(sample_id: str, request: Request) -> Any:
        body = await body_of(request) if await request.body() else {}
        other = sorted(set(body) - {"reward"})
        if other:   # a misspelt reward would otherwise end the sample scored by the reward function, without a word
            raise ServeError(400, f"POST /v1/pdsr/samples/{sample_id}/end takes {{\"reward\": R}} (or no body: the "
                                  f"session's reward function scores it); unknown field(s) {', '.join(other)}",
                             param=other[0])
        return await server.end_sample(sample_id, body.get("reward"))

    return app
