"""What the endpoint groups share: reading a request body into a model, turning it into a
validated task, and the error answers (`{"detail": ...}`, as both peers' FastAPI servers give)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from rollstream.api.joblog import JobLog, RequestError
from rollstream.contracts.events import Job

Model = TypeVar("Model", bound=BaseModel)
# The task validation `rollstream publish` applies (schema, bounds, a known environment):
# producers.publish.validate_task, handed in by the command.
Validator = Callable[[dict[str, Any]], dict[str, Any]]


class Refused(web.HTTPException):
    """An error answer: `{"detail": ...}` with its status."""

    def __init__(self, status: int, detail: Any) -> None:
        self.status_code = status
        super().__init__(text=json.dumps({"detail": detail}), content_type="application/json")


async def body(request: web.Request, model: type[Model]) -> Model:
    """The request's JSON body as `model`; 422 naming each bad field otherwise."""
    try:
        raw = await request.json()
    except json.JSONDecodeError as exc:
        raise Refused(422, f"the body is not JSON: {exc.msg}") from None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise Refused(422, [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]}
                            for e in exc.errors()]) from None


def job_log(request: web.Request) -> JobLog:
    return request["log"]


def running_job(request: web.Request) -> JobLog:
    """The request's job log, for a call that starts rollouts: the job must be RUNNING."""
    job: Job = request["job"]
    if job["state"] != "RUNNING":
        raise Refused(503, f"job {job['name']} is {job['state']}: no new rollouts "
                           "(`rollstream jobs resume`)")
    return request["log"]


def validated(validate: Validator, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The task `make` builds, validated; 422 with what is wrong otherwise."""
    try:
        return validate(make())
    except (RequestError, ValueError) as exc:
        raise Refused(422, str(exc)) from None
