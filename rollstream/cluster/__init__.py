"""Talking to the Kafka cluster: clients and their errors, offsets, transactions, topics,
followers, security (TLS, SASL, OIDC) and ACLs."""
