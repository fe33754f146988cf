"""The event contracts: Avro schemas' Python side, the codec, the topic graph, the version-stamp
wire format."""
