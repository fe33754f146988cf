"""`reverse`: a single-turn string transform, e.g. prompt "Reverse: abc", answer "cba".

Task data: {"text": "abc"}. The answer is the completion with surrounding whitespace stripped.
Reward 1.0 when it equals the reversed text; otherwise partial credit, the fraction of positions
where answer and target hold the same character, over the longer of the two:

    target "cba", answer "cbx"    -> 2/3
    target "cba", answer "cbaaaa" -> 3/6   (trailing text is penalized, so stopping is learned)

The dense partial credit is what lets a tiny byte-level model learn it from scratch. An empty
completion is an "agent" failure (reward 0.0).
"""

from __future__ import annotations

from typing import Any

from rollstream.envs.base import Score, SingleTurnEnvironment, data_str, task_data


class Reverse(SingleTurnEnvironment):
    name = "reverse"
    description = "single turn: write the task's text backwards (partial credit per character)"

    def validate_task(self, task: dict) -> None:
        data_str(task_data(task), "text")

    def parse_answer(self, completion_text: str) -> Any | None:
        return completion_text.strip() or None

    def grade(self, data: dict, answer: Any) -> Score:
        target = data_str(data, "text")[::-1]
        matches = sum(a == b for a, b in zip(answer, target, strict=False))
        reward = 1.0 if answer == target else matches / max(len(answer), len(target))
        return Score(reward, "ok", {"expected": target, "answer": answer, "matches": matches})
