"""Rollstream: rollout-as-a-service for multi-turn LLM-agent RL, as an Avro event pipeline on
Apache Kafka (the map of its packages: docs/development.md)."""
