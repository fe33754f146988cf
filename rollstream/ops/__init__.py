"""Operating a pipeline: status, windowed stats and their transport, the dead-letter topic's
tools."""
