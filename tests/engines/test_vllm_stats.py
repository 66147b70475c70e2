"""The stat loggers a VllmEngine gives vLLM: no Prometheus metrics in the process's one registry, where engines
starting at once in one process collided (vLLM's own logger)."""

from __future__ import annotations

import pytest

from support import requires_vllm

pytestmark = [requires_vllm, pytest.mark.vllm]


def test_engines_starting_at_once_in_one_process_register_no_metrics(tiny_model_dir):
    from prometheus_client import REGISTRY
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.metrics.loggers import PrometheusStatLogger, StatLoggerManager
    from vllm.v1.metrics.prometheus import unregister_vllm_metrics

    from pdsr_sdk.engines.vllm_stats import LoadRecorder, no_prometheus

    cfg = AsyncEngineArgs(model=str(tiny_model_dir), max_model_len=256, dtype="float32").create_engine_config()
    try:
        # vLLM's own logger, two engines starting at once: the second's construction unregisters the first's
        # metrics, then both register their cache info
        first, second = PrometheusStatLogger(cfg), PrometheusStatLogger(cfg)
        first.log_engine_initialized()
        with pytest.raises(ValueError, match="Duplicated timeseries.*vllm:cache_config_info"):
            second.log_engine_initialized()
        unregister_vllm_metrics()

        before = {m.name for m in REGISTRY.collect()}
        managers = [StatLoggerManager(cfg, custom_stat_loggers=[LoadRecorder().factory, no_prometheus()],
                                      enable_default_loggers=False) for _ in range(2)]
        for manager in managers:
            manager.log_engine_initialized()
            manager.record(None, None)
        assert {m.name for m in REGISTRY.collect()} == before
        assert not [lg for m in managers for lg in m.stat_loggers if type(lg) is PrometheusStatLogger]
    finally:
        unregister_vllm_metrics()
