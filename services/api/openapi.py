"""Stable operationIds for the OpenAPI document, which clients generated from it name their
methods by.

An id is ``<tag>-<verb>``: the route function's name without the noun its tag already says
(``submit_job`` under ``jobs`` is ``jobs-submit``), so moving a path keeps it;
tests/api/test_openapi_document.py pins every id, so renaming one is a deliberate change.
"""

from __future__ import annotations

from fastapi.routing import APIRoute


def operation_id(route: APIRoute) -> str:
    tag = str(route.tags[0]) if route.tags else "api"
    nouns = {tag, tag.removesuffix("s")}
    verb = [word for word in route.name.split("_") if word not in nouns] or [route.name]
    return f"{tag}-{'-'.join(verb)}"
