"""The HTTP API (`rollstream api`): ProRL Agent's and Polar's rollout APIs on a job's topics."""
