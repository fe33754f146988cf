"""The recording gateway: an OpenAI-compatible chat endpoint inside RUN that any agent harness
can be pointed at, recording every call as a Turn of the harness's episode.

Kept free of heavy imports: `rollstream.gateway.clients` is loaded by harness processes that
run in their own virtualenv.
"""
