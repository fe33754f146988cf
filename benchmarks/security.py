"""What a secured cluster costs: the stage runtime's pass-through and one-hop latency over
SASL_SSL (SCRAM-SHA-512, TLS) next to PLAINTEXT, both on the bundled broker, in one run.

The design is passthrough.py's `stage_raw` (a forwarding Stage on StageRuntime: transactions,
read_committed), run once against the plain bundled broker and once against the secured one
(`rollstream broker start --secure`), as its admin principal; the same event count and
latency rate for both. The two take turns (plain, secured, secured, plain, ...): on a shared
machine whatever else runs drifts, and measured one after the other the first listener got the
busier minute. Each figure is the median over its runs. The ratio is SASL_SSL events/s over
PLAINTEXT events/s.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from benchmarks import print_table, write_result
from benchmarks.passthrough import run_design
from rollstream.broker import local

NAME = "security"
DESIGN = "stage_raw"
TARGET_RATIO = 0.5  # TLS and SCRAM may cost, but not half the pipeline's rate


def run(quick: bool = False) -> dict[str, Any]:
    confs = {"plaintext": {"bootstrap.servers": local.resolve_bootstrap()}}
    with local.secured() as material:
        started_here = not local.is_running()
        confs["sasl_ssl"] = material.admin_conf(local.start(timeout=180))
    n = 20_000 if quick else 100_000
    rate = 500.0
    latency_events = int(rate * (2 if quick else 5))
    rounds = 2 if quick else 4
    pair = list(confs)
    order = [k for r in range(rounds) for k in (pair if r % 2 == 0 else pair[::-1])]
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in confs}
    try:
        for listener in order:
            runs[listener].append(run_design(DESIGN, confs[listener], n, 1, rate,
                                             latency_events, timeout_s=120))
    finally:
        if started_here:
            with local.secured():
                local.stop()
    results = {k: _median_of(v) for k, v in runs.items()}
    eps = {k: r["events_per_s"] for k, r in results.items()}
    p50 = {k: r["latency"]["p50_ms"] for k, r in results.items()}
    ratio = round(eps["sasl_ssl"] / eps["plaintext"], 3)
    doc = {
        "quick": quick,
        "parameters": {"design": DESIGN, "events_per_round": n, "rounds": rounds,
                       "order": order,
                       "latency_rate_per_s": rate, "latency_events": latency_events,
                       "sasl_ssl": "SCRAM-SHA-512 over TLS 1.3 (EC P-256 certificate), the "
                                   "StandardAuthorizer on, as the admin super user"},
        "results": results,
        "baseline": {"listener": "plaintext", "events_per_s": eps["plaintext"],
                     "latency_p50_ms": p50["plaintext"]},
        "ratio": ratio,
        "ratio_meaning": "sasl_ssl events/s / plaintext events/s (1.0: security costs nothing)",
        "latency_p50_ratio": (round(p50["sasl_ssl"] / p50["plaintext"], 3)
                              if p50["plaintext"] else None),
        "target": {"description": f"SASL_SSL pass-through >= {TARGET_RATIO} x PLAINTEXT's",
                   "ratio": ratio, "met": ratio >= TARGET_RATIO},
    }
    path = write_result(NAME, doc)
    rows = [[k, r["events_per_s"], f"{r['events_per_s'] / eps['plaintext']:.2f}",
             r["latency"]["p50_ms"], r["latency"].get("p99_ms")] for k, r in results.items()]
    print_table(f"security: {DESIGN}, {rounds} x {n:,} events -> results/{path.name}",
                ["listener", "events/s", "vs plaintext", "lat p50 ms", "lat p99 ms"], rows)
    print(f"SASL_SSL / PLAINTEXT pass-through: {ratio} (target >= {TARGET_RATIO}); one-hop "
          f"latency p50: {doc['latency_p50_ratio']}x")
    return doc


def _median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One listener's runs (one round each) as one result: medians, and every run's figures."""
    p50s = [r["latency"]["p50_ms"] for r in runs]
    p99s = [r["latency"].get("p99_ms") for r in runs]
    return {
        "events_per_s": round(float(np.median([r["events_per_s"] for r in runs])), 1),
        "events_per_s_rounds": [r["events_per_s"] for r in runs],
        "latency": {"p50_ms": round(float(np.median(p50s)), 2),
                    "p99_ms": round(float(np.median(p99s)), 2) if None not in p99s else None,
                    "p50_ms_rounds": p50s},
        "runs": runs,
    }


if __name__ == "__main__":
    run(quick="--quick" in sys.argv[1:])
