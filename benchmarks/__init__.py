"""Rollstream benchmarks: each module measures one design choice against the plain alternative
in the same run, and writes ``benchmarks/results/<name>.json`` (see README.md).

Shared helpers live here so every result file has the same shape.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

RESULTS_DIR = Path(__file__).resolve().parent / "results"

# Benchmark modules in the order `python -m benchmarks` runs them.
BENCHMARKS = ("codec", "checkpoint", "passthrough", "security", "saturation", "bridge", "sandbox",
              "metrics", "gateway", "turn_cpu", "fairshare", "api")
# Run only when named: each starts its own 3-node cluster or many processes, for many minutes;
# adapters needs the pinned trainers (`make trainer-deps`, first on PYTHONPATH).
ON_REQUEST = ("chaos", "chaos_jobs", "scaling", "at_scale", "adapters")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    # /proc/cpuinfo on Linux; platform.processor() is often empty there.
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _first(v: Any) -> str:
    # confluent_kafka.version() is a string in some releases, a (str, int) tuple in others.
    return str(v[0] if isinstance(v, tuple) else v)


def machine_info() -> dict[str, Any]:
    """What the numbers depend on: CPUs, interpreter and library versions (no host names)."""
    import confluent_kafka
    import fastavro

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 0
    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "cpu_model": _cpu_model(),
        "platform": platform.platform(terse=True),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "libraries": {
            "rollstream": _version("rollstream"),
            "fastavro": fastavro.__version__,
            "numpy": np.__version__,
            "confluent_kafka": _first(confluent_kafka.version()),
            "librdkafka": _first(confluent_kafka.libversion()),
        },
    }


def percentiles_ms(samples_ns: Sequence[int] | np.ndarray) -> dict[str, float]:
    """median / p99 / mean / min of nanosecond samples, in milliseconds."""
    a = np.asarray(samples_ns, dtype=np.float64) / 1e6
    if a.size == 0:
        return {"n": 0}
    return {
        "n": int(a.size),
        "median_ms": round(float(np.median(a)), 4),
        "p99_ms": round(float(np.percentile(a, 99)), 4),
        "mean_ms": round(float(a.mean()), 4),
        "min_ms": round(float(a.min()), 4),
    }


def write_result(name: str, result: dict[str, Any]) -> Path:
    """Write results/<name>.json atomically (a .tmp beside it, then rename; *.tmp is ignored)."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": name,
        "finished_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        **result,
    }
    path = RESULTS_DIR / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)
    return path


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A plain aligned text table (the JSON file has everything; this is for the terminal)."""
    cells = [[str(h) for h in header]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n{title}")
    for n, row in enumerate(cells):
        print("  " + "  ".join(c.rjust(w) if i else c.ljust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))))
        if n == 0:
            print("  " + "  ".join("-" * w for w in widths))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def script(run: Callable[..., Any], worker: Callable[[list[str]], None]) -> None:
    """A benchmark with worker processes run as a script: `python -m benchmarks.<name>
    [--quick]` runs it, `... worker ARGS` is one of its workers."""
    if sys.argv[1:2] == ["worker"]:
        worker(sys.argv[2:])
    else:
        run(quick="--quick" in sys.argv[1:])
