"""RUN's inference side: the client for vLLM-compatible servers (`client`), the router that
picks a server per episode (`routing`), the chat templates that turn conversations into token
ids (`chat`, `hf_template`, `templates/`, the embedded model's `tokenizer`). The controller that
applies new policy versions to the servers is a service of its own (rollstream.controller).

Nothing is imported here, so `rollstream.inference.tokenizer` stays free of aiohttp.
"""
