"""Engines: where generation runs (vLLM processes, Ray actors, the simulator)."""
