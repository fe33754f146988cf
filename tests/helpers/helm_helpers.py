"""Where `make helm-deps` builds Helm and the validator, and the chart they check."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HELM_DIR = ROOT / ".rollstream" / "helm"
HELM, VALIDATE, CRDS = HELM_DIR / "bin" / "helm", HELM_DIR / "bin" / "validate", HELM_DIR / "crds"
CHART = ROOT / "deploy" / "helm" / "rollstream"
