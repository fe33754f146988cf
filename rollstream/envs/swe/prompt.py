"""The first user message of a SWE episode: the task, the tools (Hermes / Qwen format, JSON
schemas inside <tools>) and the issue. Kept short: small models have small contexts."""

from __future__ import annotations

import json

from rollstream.envs.swe.instance import SweInstance
from rollstream.envs.swe.tools import TOOL_SCHEMAS

TEMPLATE = """\
Fix the issue below in the repository at /testbed (task {instance_id}). Edit the source, not \
the tests. Call submit when done.

Tools: call one with <tool_call>{{"name": ..., "arguments": {{...}}}}</tool_call>.
<tools>
{tools}
</tools>

<issue>
{issue}
</issue>"""


def render_prompt(instance: SweInstance) -> str:
    tools = "\n".join(json.dumps(schema, separators=(",", ":")) for schema in TOOL_SCHEMAS)
    return TEMPLATE.format(instance_id=instance.instance_id, tools=tools,
                           issue=instance.problem_statement.strip())
