"""Names and limits of Rollstream's wire protocols, in one module that needs only the standard
library: a vLLM server loads `rollstream.vllm_middleware`, which imports this and nothing else
of ours (docker-compose.yml mounts just these files into the vLLM container).

HTTP, between RUN, the controller and the inference servers:
- the response header carrying the policy version that produced a completion (a Rollstream
  extension; real vLLM has it only through the middleware),
- the path where a server reports its loaded version,
- the names of LoRA adapters that carry a policy version: `<adapter>-v<N>`, where `adapter` is
  a job's adapter base name (`rollstream-policy` when it names none), so jobs sharing a server
  each find their own adapters and never another job's.

Kafka: the record headers naming an event's type and schema fingerprint (for kcat or a Kafka
UI; decoding needs neither), and the largest message a topic or the bundled broker takes.
"""

from __future__ import annotations

import re

POLICY_VERSION_HEADER = "X-Rollstream-Policy-Version"
VERSION_PATH = "/rollstream/policy_version"
DEFAULT_ADAPTER = "rollstream-policy"  # the adapter base of a job that names none
# A base name: characters any server takes in a model id, and never ending in `-v<digits>`: a
# name splits at its last `-v` into one base and version, and no base reads as another job's
# versioned name (job `a`'s `a-v1` is never a job's base, `a-v1-v2` never `a`'s).
_ADAPTER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_VERSIONED = re.compile(r"-v\d+$")

RECORD_HEADER = "rollstream.record"
FINGERPRINT_HEADER = "rollstream.fingerprint"
# Largest event on the trajectory path. A 32k-token trajectory (int32 ids + float32 logprobs) is
# about 256 KiB plus its text; long multi-turn episodes with big tool outputs need far more.
# Producers and consumers on these topics must allow it too (librdkafka's message.max.bytes).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def check_adapter(adapter: str) -> str:
    """`adapter` if it is a valid adapter base name ("" is the default's), else ValueError."""
    if adapter and (not _ADAPTER.fullmatch(adapter) or _VERSIONED.search(adapter)):
        raise ValueError(
            f"adapter name {adapter!r} is not valid: 1-100 of A-Z a-z 0-9 . _ -, starting with a "
            f"letter or digit, not ending in -v<digits> (versions are appended as -v<N>)")
    return adapter


def lora_name(version: int, adapter: str = "") -> str:
    """The name under which a server holds policy `version` of the job whose adapter base name
    is `adapter` ("" : the default, `rollstream-policy-v<N>`)."""
    return f"{check_adapter(adapter) or DEFAULT_ADAPTER}-v{int(version)}"


def split_lora(model_id: str) -> tuple[str, int] | None:
    """(adapter base name, version) of any job's adapter name, else None."""
    base, _, version = model_id.rpartition("-v")
    if not base or not version.isdigit() or not version.isascii():
        return None
    return base, int(version)


def lora_version(model_id: str, adapter: str = "") -> int | None:
    """The policy version of `model_id` if it is an adapter of `adapter`'s (named by
    `lora_name(N, adapter)`), else None: another job's adapter or the base model."""
    split = split_lora(model_id)
    return split[1] if split is not None and split[0] == (adapter or DEFAULT_ADAPTER) else None
