"""The vLLM middleware loads from the files docker-compose.yml mounts into the vLLM image, with
nothing but the standard library: `rollstream.contracts.wire` is its only import of ours."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_middleware_loads_from_the_mounted_files_alone(tmp_path: Path) -> None:
    compose = (ROOT / "docker-compose.yml").read_text()
    mounted = re.findall(r"- \./(rollstream/[\w/]+\.py):/opt/rollstream/", compose)
    assert "rollstream/vllm_middleware.py" in mounted
    for path in mounted:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    # -S -I: no site-packages and no PYTHONPATH, so only the copied files and the stdlib exist.
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from rollstream.vllm_middleware import PolicyVersionMiddleware, VERSION_PATH; "
            "print(VERSION_PATH)")
    result = subprocess.run([sys.executable, "-S", "-I", "-c", code, str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "/rollstream/policy_version"
