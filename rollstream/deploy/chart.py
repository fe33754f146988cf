"""The Helm chart's view of the topic graph, generated from rollstream/contracts/graph.py into
deploy/helm/rollstream/graph.json: the chart's templates make a Strimzi KafkaTopic of every topic
and a StatefulSet and KEDA ScaledObject of every stage from it, so a topic added to the graph
cannot be forgotten there (a test fails until the file is written again).

    python -m rollstream.deploy.chart          # write the file
    python -m rollstream.deploy.chart --check  # exit 1 when it differs from the graph
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rollstream.contracts.graph import GRAPH, STAGES, input_of

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "rollstream"
GRAPH_FILE = CHART / "graph.json"


def graph() -> dict[str, Any]:
    """Topics (suffix, fixed partitions or null: the chart's `partitions`, config) and the
    stages (consumer group suffix and input topic suffix)."""
    return {
        "generated": ("from rollstream/contracts/graph.py by python -m rollstream.deploy.chart;"
                      " do not edit"),
        "topics": [{"suffix": t.suffix, "partitions": t.partitions, "config": dict(t.config)}
                   for t in GRAPH],
        "stages": {s: {"group": s, "input": input_of(s).suffix} for s in STAGES},
    }


def render() -> str:
    return json.dumps(graph(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="only check that the file matches the graph")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not GRAPH_FILE.exists() or GRAPH_FILE.read_text() != text:
            print(f"{GRAPH_FILE.name} differs from rollstream/contracts/graph.py: run "
                  "python -m rollstream.deploy.chart", file=sys.stderr)
            return 1
        return 0
    GRAPH_FILE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
