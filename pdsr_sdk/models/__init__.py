"""Local models: the built-in tiny random model and the SmolLM2 preparation."""
