"""`guess_number`: multi-turn search for a secret integer.

Task data: {"secret": 7, "low": 0, "high": 15} with low <= secret <= high; the prompt states the
range. Each turn the model's first integer is its guess, answered with "higher" or "lower", or
"answer with a number" when the completion holds none (that still uses a turn). The episode ends
on the right guess or after task["max_turns"] turns.

Reward: 1.0 for a right guess on the first turn, 0.1 less per extra turn, at least 0.1, so a
search that halves the range scores better than a linear one; 0.0 if never found. An episode with
no number at all is an "agent" failure.
"""

from __future__ import annotations

import json

from rollstream.envs.base import (
    Environment,
    InvalidTask,
    Score,
    StepResult,
    agent_failure,
    completions,
    data_int,
    first_int,
    task_data,
    termination_score,
)

HIGHER = "higher"
LOWER = "lower"
NO_NUMBER = "answer with a number"


def _reward(turns_used: int) -> float:
    # round() drops float noise (1.0 - 0.1 * 3 is 0.6999...), keeping rewards readable.
    return max(0.1, round(1.0 - 0.1 * (turns_used - 1), 6))


class GuessNumber(Environment):
    name = "guess_number"
    description = "multi-turn: find a secret integer from higher/lower hints"

    def validate_task(self, task: dict) -> None:
        data = task_data(task)
        low, high = data_int(data, "low"), data_int(data, "high")
        secret = data_int(data, "secret")
        if not low <= secret <= high:
            raise InvalidTask(f"task data field 'secret' ({secret}) is outside [{low}, {high}]")
        # Absent means the schema default (4), filled in when the task is encoded.
        if task.get("max_turns", 1) < 1:
            raise InvalidTask("task field 'max_turns' must be at least 1")

    async def reset(self, task: dict) -> dict:
        # None records a turn whose completion held no number.
        return {"guesses": []}

    async def step(self, task: dict, state: dict, completion_text: str) -> StepResult:
        secret = data_int(task_data(task), "secret")
        guess = first_int(completion_text)
        guesses = [*state["guesses"], guess]
        tool_call = None if guess is None else json.dumps({"guess": guess})
        done = guess == secret or len(guesses) >= task["max_turns"]
        if done:
            observation = None
        elif guess is None:
            observation = NO_NUMBER
        else:
            observation = HIGHER if guess < secret else LOWER
        return StepResult(observation, done, tool_call, {"guesses": guesses})

    async def evaluate(self, task: dict, trajectory: dict) -> Score:
        fixed = termination_score(trajectory)
        if fixed is not None:
            return fixed
        secret = data_int(task_data(task), "secret")
        # Re-parse the recorded completions rather than trust the checkpointed state.
        guesses = [first_int(text) for text in completions(trajectory)]
        verifier = {"secret": secret, "guesses": guesses}
        if secret in guesses:
            turns_used = guesses.index(secret) + 1
            return Score(_reward(turns_used), "ok", verifier)
        if all(guess is None for guess in guesses):
            return agent_failure("no number", **verifier)
        return Score(0.0, "ok", verifier)
