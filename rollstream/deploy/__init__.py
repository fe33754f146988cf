"""Deploying Rollstream: the Helm chart's data generated from the topic graph (`chart`), and
how big a cluster a workload needs (`plan`)."""
