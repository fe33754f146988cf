"""The contracts: Avro schemas' Python side, the codec, the topic graph, the version-stamp wire
format, and what RUN and the embedded policy server both speak (tokenizer, chat template,
sampling parameters; the tool-call formats the environments and the gateway read)."""
