"""Connecting to a Ray cluster (``pdsr_sdk.engines.ray_cluster.connect``): a bad ``ray.address`` is a
ConfigError before ``ray.init`` is called, which would otherwise retry a dead head for many minutes.

No cluster is started: ``ray.init`` is replaced by one that fails the test if it is reached."""

from __future__ import annotations

import socket

import pytest

from support import requires_ray
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.rollout.config import RayConfig


@pytest.fixture()
def ray_not_started(monkeypatch):
    """This process is not connected to Ray, and ``ray.init`` must not be reached."""
    import ray

    def no_init(*args, **kwargs):
        raise AssertionError(f"ray.init was called with {args} {kwargs}")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", no_init)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return ray


def _closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@requires_ray
def test_a_head_address_where_nothing_listens_is_a_config_error_at_once(ray_not_started, monkeypatch):
    from pdsr_sdk.engines.ray_cluster import connect

    port = _closed_port()
    with pytest.raises(ConfigError, match=rf"ray.address '127.0.0.1:{port}': nothing answers at 127.0.0.1:{port}"
                                          r".*`ray status`.*ray start --head") as info:
        connect(RayConfig(address=f"127.0.0.1:{port}"))
    assert "Traceback" not in str(info.value)
    # 'auto' stands for RAY_ADDRESS when it is set: a stale one is caught the same way
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(ConfigError, match=rf"nothing answers at 127.0.0.1:{port}"):
        connect(RayConfig(address="auto"))


@pytest.mark.parametrize("address", ["nonsense", "head:", ":6379", "head:port"])
@requires_ray
def test_an_address_that_is_no_ray_address_says_which_forms_work(address, ray_not_started):
    from pdsr_sdk.engines.ray_cluster import connect

    with pytest.raises(ConfigError, match=rf"ray.address '{address}': not a Ray address; use 'auto', 'local', "
                                          r"HOST:PORT .* or ray://HOST:10001"):
        connect(RayConfig(address=address))


@requires_ray
def test_a_listening_head_address_goes_on_to_ray_init(ray_not_started):
    """The check lets a head that answers through (ray.init is reached), as it does ray:// (and 'local')."""
    from pdsr_sdk.engines.ray_cluster import connect

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with pytest.raises(AssertionError, match=rf"address': '127.0.0.1:{port}'"):
            connect(RayConfig(address=f"127.0.0.1:{port}"))
    with pytest.raises(AssertionError, match="ray.init was called"):
        connect(RayConfig(address="ray://127.0.0.1:1"))


@requires_ray
def test_address_local_starts_a_cluster_even_where_one_runs(ray_not_started):
    """Ray joins the cluster `ray start` left on this machine (or RAY_ADDRESS) when ray.init has no address,
    and starts a new one for address 'local': 'local' must reach ray.init as such."""
    from pdsr_sdk.engines.ray_cluster import connect

    with pytest.raises(AssertionError, match=r"\{'address': 'local', 'num_cpus': 3, 'include_dashboard': False"):
        connect(RayConfig(address="local", local_num_cpus=3))


@requires_ray
def test_a_refused_connection_says_rays_own_reason(ray_not_started, monkeypatch):
    """Ray wraps why it could not join a head it reached (an auth token it lacks, a version mismatch) in
    ConnectionError('Failed to connect to Ray cluster at X') with the reason, a traceback's text, as its cause
    (ray/_private/worker.py); the error keeps that reason's last line."""
    from pdsr_sdk.engines.ray_cluster import connect

    def refused(**kwargs):
        reason = RuntimeError("Failed to connect to GCS. Last connection error: Traceback (most recent call last):\n"
                              '  File "node.py", line 996, in _init_gcs_client\n'
                              "ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: token is missing")
        raise ConnectionError(f"Failed to connect to Ray cluster at {kwargs['address']}") from reason

    monkeypatch.setattr(ray_not_started, "init", refused)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with pytest.raises(ConfigError) as info:
            connect(RayConfig(address=f"127.0.0.1:{port}"))
    msg = str(info.value)
    assert f"Failed to connect to Ray cluster at 127.0.0.1:{port}; ray.exceptions.AuthenticationError: RPC error: " \
           "InvalidAuthToken: token is missing" in msg
    assert "Traceback" not in msg and "node.py" not in msg
    # the head answered: what to do is the token, not starting a cluster
    assert "set RAY_AUTH_MODE=token here" in msg and "start a cluster first" not in msg


@pytest.mark.parametrize("auth_mode", [None, "token"])
@requires_ray
def test_a_ray_client_timeout_names_the_token_unless_it_is_set(auth_mode, ray_not_started, monkeypatch):
    """A Ray Client server whose cluster wants a token drops a client that sends none, which sees only
    ConnectionError('ray client connection timeout') (Ray 2.60, ray/util/client/worker.py): without
    RAY_AUTH_MODE=token the error says to set it; with it, only how to start a cluster."""
    from pdsr_sdk.engines.ray_cluster import connect

    def timeout(**kwargs):
        raise ConnectionError("ray client connection timeout")

    monkeypatch.setattr(ray_not_started, "init", timeout)
    if auth_mode:
        monkeypatch.setenv("RAY_AUTH_MODE", auth_mode)
    else:
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    with pytest.raises(ConfigError) as info:
        connect(RayConfig(address="ray://127.0.0.1:10001"))
    msg = str(info.value)
    assert msg.startswith("ray.address 'ray://127.0.0.1:10001': cannot connect to a Ray cluster (ConnectionError: "
                          "ray client connection timeout)")
    assert ("RAY_AUTH_MODE=token" in msg) == (auth_mode is None) and "ray start --head" in msg
