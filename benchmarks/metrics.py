"""What Prometheus metrics cost a stage: the pass-through harness (benchmarks/passthrough.py)
run with metrics off and on, in the same run.

Designs `stage_raw` (forwarding Stage: the runtime's own work is smallest, so the metrics' share
is largest) and `stage` (decode + encode, what a real stage does), each measured with the
metrics off (no /metrics server: the runtime's no-op metrics) and on (a /metrics server, scraped
every second by a thread here, more often than Prometheus' default 15 s). Off and on run back
to back (one throughput round each, fresh topics), in alternating order from trial to trial, so
drift on a shared machine hits both; the ratio is the median of the trials' on/off ratios.
Target: on >= 0.95 x off for both designs.
"""

from __future__ import annotations

import sys
import threading
import urllib.request
from typing import Any
from unittest import mock

import numpy as np

from benchmarks import print_table, write_result
from benchmarks.passthrough import run_design
from rollstream import metrics
from rollstream.broker import local
from rollstream.processes import free_port

NAME = "metrics"
TARGET_RATIO = 0.95
DESIGNS = ("stage_raw", "stage")


class Scraper:
    """GETs /metrics every `interval_s` until stopped, as a Prometheus server would."""

    def __init__(self, port: int, interval_s: float = 1.0) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.interval_s = interval_s
        self.scrapes = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            with urllib.request.urlopen(self.url, timeout=5) as r:
                r.read()
            self.scrapes += 1

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(10)


def run(quick: bool = False) -> dict[str, Any]:
    bootstrap = local.resolve_bootstrap()
    n = 20_000 if quick else 100_000
    trials = 2 if quick else 6
    port = free_port()
    metrics.serve(port, host="127.0.0.1")
    scraper = Scraper(port)
    rates: dict[str, dict[str, list[float]]] = {d: {"off": [], "on": []} for d in DESIGNS}
    try:
        for trial in range(trials):
            for design in DESIGNS:
                for mode in ("off", "on") if trial % 2 == 0 else ("on", "off"):
                    # The runtime picks real or no-op metrics when it is built.
                    with mock.patch.object(metrics, "_serving", mode == "on"):
                        result = run_design(design, bootstrap, n, rounds=1, rate=200.0,
                                            latency_events=50, timeout_s=120)
                    rates[design][mode].append(result["events_per_s"])
    finally:
        scraper.stop()
    eps = {d: {m: round(float(np.median(r)), 1) for m, r in by.items()}
           for d, by in rates.items()}
    ratios = {d: round(float(np.median(np.divide(by["on"], by["off"]))), 3)
              for d, by in rates.items()}
    doc = {
        "quick": quick,
        "parameters": {"events_per_trial": n, "trials": trials, "scrape_interval_s": 1.0,
                       "scrapes": scraper.scrapes,
                       "order": "per trial and design: off then on, on then off in odd trials"},
        "results": {d: {"events_per_s": eps[d], "events_per_s_trials": rates[d],
                        "on_over_off": ratios[d]} for d in DESIGNS},
        "baseline": {"design": "metrics off", "events_per_s": {d: eps[d]["off"] for d in DESIGNS}},
        "ratio": min(ratios.values()),
        "ratio_meaning": "median over trials of events/s with metrics on / off, the worse "
                         "design; 1.0: free",
        "target": {"description": f"metrics on >= {TARGET_RATIO} x off for each design",
                   "ratio": min(ratios.values()), "met": min(ratios.values()) >= TARGET_RATIO},
    }
    path = write_result(NAME, doc)
    print_table(f"metrics: {trials} trials x {n:,} events per design and mode -> "
                f"results/{path.name}", ["design", "off events/s", "on events/s", "on/off"],
                [[d, eps[d]["off"], eps[d]["on"], ratios[d]] for d in DESIGNS])
    print(f"  target: on/off >= {TARGET_RATIO} -> {'MET' if doc['target']['met'] else 'NOT MET'}")
    return doc


if __name__ == "__main__":
    run(quick="--quick" in sys.argv[1:])
