"""Tasks out for the adapters whose trainer hands over prompts (TRL's service mode, verl)."""

from __future__ import annotations

import uuid
from typing import Any

from producers.publish import publish, validate_task
from rollstream.config import Settings
from rollstream.envs.registry import get_env


def publish_tasks(settings: Settings, source: str, env: str, prompts: list[str],
                  data: list[dict[str, Any]], group_size: int) -> list[str]:
    """Publish one task per prompt (ids `<source>-<random>`), checked here as INIT checks them,
    env data included: INIT would dead-letter a bad one, and the trainer would wait for a group
    that never comes. Returns the task ids in prompt order."""
    tasks = []
    for prompt, values in zip(prompts, data, strict=True):
        task = validate_task({"task_id": f"{source}-{uuid.uuid4().hex[:12]}", "env": env,
                              "prompt": prompt, "data": values, "group_size": group_size},
                             settings=settings)
        get_env(env).validate_task(task)
        tasks.append(task)
    publish(settings, tasks)
    return [t["task_id"] for t in tasks]
