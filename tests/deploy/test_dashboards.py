"""The Grafana dashboards (deploy/grafana/dashboards): each is valid JSON Grafana provisions,
names the provisioned data source, uses only variables it defines, and queries only metrics the
processes export, in PromQL that Prometheus's own checker accepts; the jobs dashboard repeats a
row per job over the job label."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "deploy/grafana/dashboards").glob("*.json"))
SUFFIXES = ("", "_total", "_bucket", "_count", "_sum", "_created")
METRIC = re.compile(r"\brollstream_[a-z0-9_]+\b")
VARIABLE = re.compile(r"\$(\w+)")
# Label matchers and grouping clauses: the names in them are labels, not metrics.
LABELS = re.compile(r"\{[^}]*\}|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def metrics_in(expr: str) -> set[str]:
    return set(METRIC.findall(LABELS.sub(" ", expr)))


def exported() -> set[str]:
    """Every series name this code's /metrics can serve (rollstream.telemetry.metrics defines them
    all)."""
    from prometheus_client import REGISTRY

    from rollstream.telemetry import metrics

    assert metrics.JOB_LABEL  # imported for its registrations
    return {family.name + suffix for family in REGISTRY.collect() for suffix in SUFFIXES}


def targets(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for p in dashboard["panels"] for t in p.get("targets", [])]


def datasource_uid() -> str:
    provisioned = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    return provisioned["datasources"][0]["uid"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_a_dashboard_queries_only_what_exists(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in dashboard.get("templating", {}).get("list", [])}
    names = exported()
    assert targets(dashboard)
    for panel in dashboard["panels"]:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
        assert panel.get("repeat") is None or panel["repeat"] in variables, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == datasource_uid(), panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            assert metrics_in(expr) <= names, (panel["title"], expr)
            assert set(VARIABLE.findall(expr + panel["title"])) <= variables, expr
    for variable in dashboard.get("templating", {}).get("list", []):
        values_of = re.fullmatch(r"label_values\((\w+), *\w+\)", variable["definition"])
        assert values_of is not None and values_of[1] in names, variable["definition"]


def test_the_jobs_dashboard_repeats_a_row_per_job() -> None:
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/rollstream-jobs.json").read_text())
    [variable] = dashboard["templating"]["list"]
    assert variable["definition"] == "label_values(rollstream_episodes_total, rollstream_job)"
    assert variable["includeAll"] and variable["multi"]
    rows = [p for p in dashboard["panels"] if p["type"] == "row"]
    assert [r["repeat"] for r in rows] == ["job"]
    below = [p for p in dashboard["panels"] if p["gridPos"]["y"] > rows[0]["gridPos"]["y"]]
    queried = " ".join(t["expr"] for p in below for t in p["targets"])
    for name in ("rollstream_episodes_total", "rollstream_turns_total",
                 "rollstream_sampled_tokens_total", "rollstream_sandbox_seconds_total",
                 "rollstream_server_seconds_total", "rollstream_events_dead_lettered_total",
                 "rollstream_episode_staleness_versions_bucket"):
        assert name in queried, name
    for panel in below:  # every series of the row is the job's own
        for target in panel["targets"]:
            assert 'rollstream_job="$job"' in target["expr"], target["expr"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool installed")
def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    exprs = [t["expr"] for path in DASHBOARDS for t in targets(json.loads(path.read_text()))]
    rules = {"groups": [{"name": "dashboards", "rules": [
        {"record": f"dashboard:query{i}", "expr": VARIABLE.sub("x", expr)}
        for i, expr in enumerate(exprs)]}]}
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    checked = subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yml")],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
