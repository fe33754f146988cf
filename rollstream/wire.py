"""Names and limits of Rollstream's wire protocols, in one module that needs only the standard
library: a vLLM server loads `rollstream.vllm_middleware`, which imports this and nothing else
of ours (docker-compose.yml mounts just these files into the vLLM container).

HTTP, between RUN, the controller and the inference servers:
- the response header carrying the policy version that produced a completion (a Rollstream
  extension; real vLLM has it only through the middleware),
- the path where a server reports its loaded version,
- the names of LoRA adapters that carry a policy version.

Kafka: the record headers naming an event's type and schema fingerprint (for kcat or a Kafka
UI; decoding needs neither), and the largest message a topic or the bundled broker takes.
"""

from __future__ import annotations

import re

POLICY_VERSION_HEADER = "X-Rollstream-Policy-Version"
VERSION_PATH = "/rollstream/policy_version"
LORA_PREFIX = "rollstream-policy-v"
_LORA_NAME = re.compile(re.escape(LORA_PREFIX) + r"(\d+)$")

RECORD_HEADER = "rollstream.record"
FINGERPRINT_HEADER = "rollstream.fingerprint"
# Largest event on the trajectory path. A 32k-token trajectory (int32 ids + float32 logprobs) is
# about 256 KiB plus its text; long multi-turn episodes with big tool outputs need far more.
# Producers and consumers on these topics must allow it too (librdkafka's message.max.bytes).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def lora_name(version: int) -> str:
    """The name under which a server holds the LoRA adapter of policy `version`."""
    return f"{LORA_PREFIX}{version}"


def lora_version(model_id: str) -> int | None:
    """The policy version of a LoRA adapter named by `lora_name`, else None."""
    match = _LORA_NAME.match(model_id)
    return int(match.group(1)) if match else None
