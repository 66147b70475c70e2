"""An engine backend of one's own (``engines: [{backend: my_pkg.mod:Class}]``): one without ``from_spec``, or whose
``from_spec`` returns no Engine, is a ConfigError naming the engine and the backend when the engines are built;
a complete one (tests/fakes.py's ``LoopEngine``) is built as it is."""

from __future__ import annotations

import asyncio
import re

import pytest

from pdsr_sdk.engines import build_engine
from pdsr_sdk.engines.config import EngineSpec
from pdsr_sdk.errors import ConfigError


class NoFromSpec:
    pass


class HalfEngine:
    """Its from_spec returns an object with a name and a pool only."""

    @classmethod
    def from_spec(cls, spec, **context):
        engine = cls()
        engine.name, engine.pool = spec.name, spec.pool
        return engine


@pytest.mark.parametrize("cls, says", [
    ("NoFromSpec", "has no from_spec(spec, **context); an engine backend is a class whose from_spec returns an "
                   "Engine"),
    ("HalfEngine", ": from_spec returned HalfEngine, which lacks max_concurrency, segment_capacity_tokens, "
                   "kv_cache_tokens, start, bind, submit, abort, load, close of the Engine protocol"),
])
def test_a_backend_that_builds_no_engine_is_named(cls, says):
    """They used to be an AttributeError ('type object has no attribute from_spec'), or one at the first request."""
    path = f"{__name__}:{cls}"
    with pytest.raises(ConfigError, match=re.escape(f"engine 'f0': backend {path!r}") + " ?" + re.escape(says)):
        build_engine(EngineSpec(name="f0", pool="fast", backend=path))


def test_a_complete_backend_is_built_as_it_is():
    async def build():
        return build_engine(EngineSpec(name="f0", pool="fast", backend="fakes:LoopEngine", max_num_seqs=3))

    engine = asyncio.run(build())
    assert (type(engine).__name__, engine.name, engine.pool, engine.max_concurrency) == ("LoopEngine", "f0", "fast", 3)
