"""`python -m benchmarks [--quick] [NAME ...]`: run every benchmark, or the ones named."""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from benchmarks import BENCHMARKS, ON_REQUEST, RESULTS_DIR


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=f"Run Rollstream's benchmarks; each writes {RESULTS_DIR.name}/<name>.json.",
    )
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"benchmarks to run (default: all of {', '.join(BENCHMARKS)}; "
                        f"only when named: {', '.join(ON_REQUEST)})")
    parser.add_argument("--quick", action="store_true",
                        help="fewer iterations / events: a smoke run, not numbers to quote")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS + ON_REQUEST]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; known: {list(BENCHMARKS + ON_REQUEST)}")

    missed: list[str] = []
    for name in args.names or BENCHMARKS:
        start = time.monotonic()
        print(f"== {name}{' (quick)' if args.quick else ''}", flush=True)
        # Imported here so `python -m benchmarks codec` needs no broker module at all.
        doc = importlib.import_module(f"benchmarks.{name}").run(quick=args.quick)
        if not doc["target"]["met"]:
            missed.append(name)
        print(f"   ({time.monotonic() - start:.1f} s)", flush=True)
    if missed:
        print(f"\ntargets not met: {', '.join(missed)} (see {RESULTS_DIR.name}/*.json)")
    # A missed target is a finding, not a failure of the run: exit 0 either way.
    return 0


if __name__ == "__main__":
    sys.exit(main())
