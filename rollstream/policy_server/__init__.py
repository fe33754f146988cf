"""The embedded policy's inference server: a tiny causal LM (`model`) behind vLLM's
OpenAI-compatible HTTP contract (`app`), so RUN talks to it exactly as to a vLLM server.

Only the submodules import torch; importing this package does not.
"""
