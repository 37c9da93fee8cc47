"""The one shape of every error the API answers, and the statuses each route documents.

Every error body is ``{"detail": ...}``: a sentence, or for invalid input (422) the list of
field errors, with ``message`` joining them into one line. Routes declare the statuses they
can answer with :func:`errors`, so the OpenAPI document lists each one a client may see
(tests/api/test_openapi_fuzz.py checks every response against it).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

# What each status means, wherever it is answered.
MEANING = {
    400: "a header that cannot be read (Last-Event-ID that is not a sequence number)",
    401: "no bearer token, or one that is not valid (only when UNICRON_API_TOKENS is set)",
    403: "the token's role may not do this",
    404: "no such resource, or one the token's tenant may not see",
    409: "the resource is in a state that does not allow this",
    413: "the body is over the size limit",
    422: "invalid input: `detail` lists each field's error, `message` joins them",
    502: "the node's agent answered with an error",
    503: "Redis, NATS or a node's agent is unavailable; retry after Retry-After seconds",
}
# FastAPI's own answer to a body it cannot decode (not UTF-8); invalid JSON is a 422.
_UNPARSABLE_BODY = "There was an error parsing the body"


class FieldError(BaseModel):
    """One invalid input: where (``["body", "steps"]``), what is wrong, and its kind."""

    loc: list[str | int]
    msg: str
    type: str


class ApiError(BaseModel):
    """The body of every 4xx and 5xx answer."""

    detail: str | list[FieldError] = Field(
        description="why: a sentence, or for a 422 each invalid field"
    )
    message: str | None = Field(None, description="a 422's field errors in one line")


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route or router that may answer ``statuses``."""
    return {status: {"model": ApiError, "description": MEANING[status]} for status in statuses}


def _readable(error: dict[str, Any]) -> dict[str, Any]:
    """One validation error as ``{loc, msg, type}``, with the message a user can act on."""
    msg = str(error.get("msg", ""))
    ctx = error.get("ctx") or {}
    if error.get("type") == "value_error":  # a model-level check: its text names the fields
        msg = msg.removeprefix("Value error, ")
    elif error.get("type") == "json_invalid" and "error" in ctx:
        msg = f"{msg}: {ctx['error']}"
    return {"loc": list(error.get("loc", ())), "msg": msg, "type": str(error.get("type"))}


def _summary(error: dict[str, Any]) -> str:
    """``field.path: message``; a model-level message names its fields itself."""
    path = ".".join(str(part) for part in error["loc"] if part != "body")
    return f"{path}: {error['msg']}" if path else str(error["msg"])


def invalid(errors: list[dict[str, Any]]) -> JSONResponse:
    detail = [_readable(e) for e in errors]
    message = "; ".join(_summary(d) for d in detail)
    return JSONResponse({"detail": detail, "message": message}, status_code=422)


async def validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return invalid([dict(e) for e in exc.errors()])


async def http_error(request: Request, exc: Exception) -> Response:
    """FastAPI's answer, except a body that is not even text: invalid JSON like any other."""
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and exc.detail == _UNPARSABLE_BODY:
        cause = exc.__cause__
        why = "the body is not UTF-8" if isinstance(cause, UnicodeDecodeError) else "unreadable"
        msg = f"JSON decode error: {why} ({cause})"
        return invalid([{"loc": ("body",), "msg": msg, "type": "json_invalid"}])
    return await http_exception_handler(request, exc)
