"""`arithmetic`: a single-turn question with an integer answer, e.g. "What is 3+4?".

Task data: {"answer": "7"} (an integer, or an integer written as a string). Reward 1.0 when the
first integer in the completion equals the answer, else 0.0; a completion with no integer at all
is an "agent" failure. Only the first integer counts, so "7, or maybe 8" cannot hedge.
"""

from __future__ import annotations

from typing import Any

from rollstream.envs.base import Score, SingleTurnEnvironment, data_int, first_int, task_data


class Arithmetic(SingleTurnEnvironment):
    name = "arithmetic"
    description = "single turn: answer an arithmetic question with an integer"

    def validate_task(self, task: dict) -> None:
        data_int(task_data(task), "answer")

    def parse_answer(self, completion_text: str) -> Any | None:
        return first_int(completion_text)

    def grade(self, data: dict, answer: Any) -> Score:
        expected = data_int(data, "answer")
        reward = 1.0 if answer == expected else 0.0
        return Score(reward, "ok", {"expected": expected, "answer": answer})
