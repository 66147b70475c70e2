"""Serving OpenAI-style requests, the part of :class:`~pdsr_sdk.rollout.session.RolloutSession` that runs an HTTP
server (:mod:`pdsr_sdk.rollout.serve`) on its engines and policy."""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Callable

from pdsr_sdk.errors import ConfigError, RunError
from pdsr_sdk.policies.resolve import check_streaming


class Serving:
    """:meth:`serve`, :meth:`aserve` and :meth:`stop_serving` (a mixin of
    :class:`~pdsr_sdk.rollout.session.RolloutSession`, whose config, policy, ``streaming``, ``start()``, model folder
    and ``_call`` it uses). :meth:`_init_serving` sets its state when the session is made."""

    def _init_serving(self) -> None:
        self._http = None   # the HTTP server while serving (aserve)

    def serve(self, host: str = "127.0.0.1", port: int = 8000, **kw: Any) -> None:
        """Serve OpenAI-style requests until :meth:`stop_serving` or Ctrl-C (synchronous; see :meth:`aserve`)."""
        return self._call(self.aserve(host, port, **kw), "serve")

    async def aserve(self, host: str = "127.0.0.1", port: int = 8000, *, model_name: str | list[str] | None = None,
                     tool_parser: str | None = None, on_ready: Callable[[int], None] | None = None) -> None:
        """Serve ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``, ``POST /tokenize``
        and ``POST /detokenize`` (and vLLM's ``/health``, ``/ping`` and ``/version``) on the engines, each request a
        group through the policy, until :meth:`stop_serving` (:mod:`pdsr_sdk.rollout.serve`: named samples, recorded
        token-exact). ``on_ready(port)`` is called once it listens (``port=0``: any free port). ``model_name``: the
        name, or names, a request's ``model`` may be (another is a 404, as vLLM's server answers it; default the
        model folder's name, and the folder as given). ``tool_parser``: parse the model's tool calls into
        ``tool_calls`` with that vLLM parser. A port out of range or taken, an empty model name, or a tool parser the
        installed vLLM lacks, is a ConfigError (before the engines start, where this call starts them)."""
        import uvicorn

        from pdsr_sdk.agent.tools import check_tool_parser
        from pdsr_sdk.rollout.serve import ChatServer
        from pdsr_sdk.rollout.serve_app import create_app
        from pdsr_sdk.rollout.serve_model import served_names

        check_serve_config(self.config)
        check_tool_parser(tool_parser)
        names, aliases = served_names(model_name, self._model_dir())
        check_streaming(self.policy_cls, self.config.policy)   # requests arrive while others run
        if not self._started:
            check_listen_address(host, port)   # before the engines start
            await self.start()
        # our socket: a port taken since is an error here (uvicorn would exit the session's loop thread: a hang)
        sock = listen_socket(host, port)
        try:
            server = ChatServer(self, model_name=names, aliases=aliases, tool_parser=tool_parser)
            http = uvicorn.Server(uvicorn.Config(create_app(server), host=host, port=port, log_level="warning",
                                                 lifespan="off"))
        except BaseException:
            sock.close()
            raise
        self._http = http

        async def run_http() -> None:
            try:
                await http.serve(sockets=[sock])
            except SystemExit as exc:   # uvicorn's way to fail; out of a task it would stop the session's loop
                raise RunError(f"serve: the HTTP server on {host}:{port} failed (exit status {exc.code})") from None
            finally:
                sock.close()

        task = asyncio.ensure_future(run_http())
        try:
            while not http.started and not task.done():
                await asyncio.sleep(0.02)
            if http.started and on_ready is not None:
                on_ready(http.servers[0].sockets[0].getsockname()[1])
            await task
        finally:
            self._http = None
            server.close()
            if not task.done():
                http.should_exit = True
                await asyncio.gather(task, return_exceptions=True)

    def stop_serving(self) -> None:
        """Stop :meth:`aserve` (it returns once open requests are answered); from any thread."""
        if self._http is not None:
            self._http.should_exit = True


def check_serve_config(config) -> None:
    """A ConfigError unless ``config`` (a RolloutConfig) can serve: requests run as they come, so no stream of
    steps (``over_provision``, ``steps``, ``filter_groups``). ``pdsr serve`` calls it before its engines start."""
    if config.streaming:
        raise ConfigError("serve: a serving session runs requests as they come; drop over_provision, steps "
                          "and filter_groups")


def check_listen_address(host: str, port: int, *, host_flag: str = "host", port_flag: str = "port") -> None:
    """Raise a :class:`~pdsr_sdk.errors.ConfigError` naming ``port_flag`` (or ``host_flag``) unless a server can
    listen on ``host:port`` now: a port in 0-65535 (0: any free one) that is free. It binds and closes at once."""
    listen_socket(host, port, host_flag=host_flag, port_flag=port_flag).close()


def listen_socket(host: str, port: int, *, host_flag: str = "host", port_flag: str = "port") -> socket.socket:
    """A TCP socket bound to ``host:port`` (not yet listening), or a ConfigError that names the flag."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"{port_flag}: {port!r} is not a port; expected 0-65535 (0: any free one)")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise ConfigError(f"{host_flag}: cannot listen on {host!r}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as uvicorn does: past TIME_WAIT, not a listener
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"{port_flag}: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock
