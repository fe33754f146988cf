"""The shared rollout service: jobs, the fleet that serves them, fair share, quotas and usage
accounting."""
