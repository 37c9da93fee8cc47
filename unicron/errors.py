"""What the Python client raises: no answer at all, or the API's error with its status and why.

:class:`ApiError` carries the status and the API's own sentence (for invalid input, its field
errors joined into one line); a subclass per status a caller may want to catch on its own.
:func:`raise_for` is the one place an answer becomes an exception, for both clients.
"""

from __future__ import annotations

from typing import Any

import httpx


class UnicronError(Exception):
    """Base of everything the client raises."""


class ApiUnreachable(UnicronError):
    """No HTTP answer: the server is down, the address is wrong, or the connection broke."""


class WaitTimedOut(UnicronError, TimeoutError):
    """``wait`` gave up before the job reached one of the states asked for."""


class ApiError(UnicronError):
    """The API answered with an error status; ``message`` is its explanation."""

    def __init__(self, status_code: int, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code = status_code
        self.message = message
        self.retry_after_s = retry_after_s


class Unauthorized(ApiError):
    """401: no token, or one the API does not know."""


class Forbidden(ApiError):
    """403: the token's role may not do this."""


class NotFound(ApiError):
    """404: no such job, plan or rank, or one the token's tenant may not see."""


class Conflict(ApiError):
    """409: the job is in a state that does not allow this (say, cancelling a finished job)."""


class InvalidRequest(ApiError):
    """422: invalid input; ``message`` names each invalid field."""


class Unavailable(ApiError):
    """503: Redis, NATS or a node's agent is away; retry after ``retry_after_s``."""


BY_STATUS: dict[int, type[ApiError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    422: InvalidRequest,
    503: Unavailable,
}


def error_message(response: httpx.Response) -> str:
    """The API's explanation: ``message`` or ``detail`` of a JSON error, else the text."""
    try:
        body: Any = response.json()
    except ValueError:
        return response.text.strip() or response.reason_phrase
    if isinstance(body, dict):
        if isinstance(body.get("message"), str):
            return str(body["message"])
        detail = body.get("detail")
        if isinstance(detail, str):
            return detail
        if isinstance(detail, list):
            return "; ".join(
                f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" for d in detail
            )
    return str(body)


def raise_for(response: httpx.Response) -> None:
    """Raise the :class:`ApiError` of an error answer (its body already read); else nothing."""
    if not response.is_error:
        return
    retry = response.headers.get("Retry-After")
    retry_after_s = float(retry) if retry and retry.isdigit() else None
    kind = BY_STATUS.get(response.status_code, ApiError)
    raise kind(response.status_code, error_message(response), retry_after_s)


def unreachable(base_url: str, exc: httpx.TransportError) -> ApiUnreachable:
    return ApiUnreachable(f"cannot reach the Unicron API at {base_url}: {exc}")
