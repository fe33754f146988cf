"""RUN's inference side: the client for vLLM-compatible servers (`client`), the router that
picks a server per episode (`routing`), the chat templates that turn conversations into token
ids (`chat`, `hf_template`, `templates/`). The embedded policy's tokenizer, chat template and
sampling parameters, which its server speaks too, are rollstream.contracts.inference; the
controller that applies new policy versions to the servers is a service of its own
(rollstream.controller).

Nothing is imported here, so importing a submodule pulls in only what it needs (aiohttp for the
client and the router).
"""
