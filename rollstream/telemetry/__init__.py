"""What every long-running process reports: Prometheus metrics and health (/health, /ready)."""
