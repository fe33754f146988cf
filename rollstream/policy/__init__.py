"""The embedded default policy: a tiny causal LM and a vLLM-compatible HTTP server for it."""
