"""The demo and what tests and benchmarks run against, kept apart from production code: the
demo's closed loop and the process group it starts (`demo`, `loop`, `processes`), and the
stand-in inference servers (`simulated`: vLLM's HTTP contract with a GPU's timing; `scripted`:
completions read from scripts). No production module imports this package (pyproject's
import-linter contracts check it).
"""
