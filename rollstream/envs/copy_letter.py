"""`copy_letter`: "Say c" → the model must answer with that letter. The demo's environment.

It is chosen so that reinforcement learning visibly works within minutes on two CPU cores: the
tiny embedded policy only has to learn to copy one character of the prompt. Task data:
{"letter": "c"}. Reward 1.0 when the completion's first character is the letter, else 0.0; an
empty completion is an "agent" failure.
"""

from __future__ import annotations

from typing import Any

from rollstream.envs.base import InvalidTask, Score, SingleTurnEnvironment, data_str, task_data

LETTERS = "abcdefgh"


class CopyLetter(SingleTurnEnvironment):
    name = "copy_letter"
    description = "single turn: answer with the letter the prompt names (the learning demo)"

    def validate_task(self, task: dict) -> None:
        letter = data_str(task_data(task), "letter")
        if len(letter) != 1:
            raise InvalidTask(f"task data field 'letter' must be one character, got {letter!r}")

    def parse_answer(self, completion_text: str) -> Any | None:
        text = completion_text.strip()
        return text[0] if text else None

    def grade(self, data: dict, answer: Any) -> Score:
        expected = data_str(data, "letter")
        return Score(1.0 if answer == expected else 0.0, "ok",
                     {"expected": expected, "answer": answer})


def demo_tasks(n: int, group_size: int = 8, seed: int = 0) -> list[dict]:
    """n tasks over LETTERS, in a seeded order."""
    import random

    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        letter = rng.choice(LETTERS)
        tasks.append({
            "task_id": f"copy-{i}", "env": "copy_letter", "prompt": f"Say {letter}",
            "data": {"letter": letter}, "group_size": group_size, "max_turns": 1,
            "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 3,
                         "seed": None},
        })
    return tasks
