"""mini-swe-agent's environment for Rollstream episodes: its `LocalEnvironment`, with each
command run in the episode's sandbox through RUN's gateway (`$ROLLSTREAM_EXEC_URL`, the
episode's `$OPENAI_API_KEY`) instead of on the harness's host.

Select it with mini-swe-agent's documented setting
`environment.environment_class: rollstream.gateway.clients.minisweagent.SandboxEnvironment`.
Submission is detected exactly as mini-swe-agent's own environments do (`_check_finished`).
"""

from __future__ import annotations

import json
import os
import shlex
import urllib.error
import urllib.request
from typing import Any

from minisweagent.environments.local import LocalEnvironment

HTTP_SLACK_S = 30  # beyond the command's own timeout, for the sandbox to report back


def run_in_sandbox(command: str, timeout: float) -> dict[str, Any]:
    """POST the command to the gateway; its JSON answer (output, returncode, timed_out)."""
    request = urllib.request.Request(
        os.environ["ROLLSTREAM_EXEC_URL"],
        data=json.dumps({"command": command, "timeout": timeout}).encode(),
        headers={"Content-Type": "application/json",
                 "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"})
    # The gateway is on the loopback interface: no proxy, whatever the environment says.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=timeout + HTTP_SLACK_S) as response:
        return json.loads(response.read())


class SandboxEnvironment(LocalEnvironment):
    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        command = action.get("command", "")
        limit = timeout or self.config.timeout
        if cwd or self.config.cwd:
            command = f"cd {shlex.quote(cwd or self.config.cwd)} && {command}"
        try:
            result = run_in_sandbox(command, limit)
        except urllib.error.HTTPError as exc:  # the episode ended or the sandbox failed
            raise RuntimeError(f"sandbox: HTTP {exc.code}: {exc.read().decode()}") from exc
        output = {"output": result["output"], "returncode": result["returncode"],
                  "exception_info": ""}
        if result["timed_out"]:
            output["exception_info"] = f"The command timed out after {limit} seconds."
        self._check_finished(output)
        return output
