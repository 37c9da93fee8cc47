"""The OpenAPI document a client is generated from: a stable operationId per operation (pinned
here, so a rename is deliberate), every error status each operation can answer with the one
error model, and the media types of the event stream, the logs and the metrics."""

from __future__ import annotations

from typing import Any

import pytest
from unicron.services.api.app import create_app
from unicron.services.api.settings import ApiSettings

# operationId: (method, path, the error statuses it documents). 401 and 503 on every /v1 call:
# tokens apply to each, and each reads Redis or NATS.
OPERATIONS = {
    "jobs-submit": ("post", "/v1/jobs", {401, 403, 422, 503}),
    "jobs-list": ("get", "/v1/jobs", {401, 422, 503}),
    "jobs-get": ("get", "/v1/jobs/{job_id}", {401, 404, 422, 503}),
    "jobs-cancel": ("post", "/v1/jobs/{job_id}/cancel", {401, 404, 409, 422, 503}),
    "packages-upload": ("post", "/v1/packages", {401, 413, 422, 503}),
    "faults-inject": ("post", "/v1/jobs/{job_id}/faults", {401, 403, 404, 409, 422, 503}),
    "logs-get": ("get", "/v1/jobs/{job_id}/logs", {401, 404, 422, 502, 503}),
    "nodes-list": ("get", "/v1/nodes", {401, 503}),
    "plans-latest": ("get", "/v1/plans/latest", {401, 404, 503}),
    "plans-get": ("get", "/v1/plans/{plan_id}", {401, 404, 422, 503}),
    "calibration-get": ("get", "/v1/calibration", {401, 404, 503}),
    "events-stream": ("get", "/v1/events", {400, 401, 403, 404, 422, 503}),
    "webhooks-list": ("get", "/v1/webhooks", {401, 503}),
    "webhooks-create": ("post", "/v1/webhooks", {401, 403, 404, 409, 422, 503}),
    "webhooks-get": ("get", "/v1/webhooks/{webhook_id}", {401, 404, 422, 503}),
    "webhooks-delete": ("delete", "/v1/webhooks/{webhook_id}", {401, 404, 422, 503}),
    "health-livez": ("get", "/livez", set()),
    "health-readyz": ("get", "/readyz", {503}),
    "health-metrics": ("get", "/metrics", {401, 403}),
}
MEDIA_TYPES = {
    "events-stream": "text/event-stream",
    "logs-get": "text/plain",
    "health-metrics": "text/plain",
    "jobs-get": "application/json",
}


@pytest.fixture(scope="module")
def operations() -> dict[str, tuple[str, str, dict[str, Any]]]:
    """operationId → (method, path, operation), from the document the app serves."""
    doc = create_app(ApiSettings()).openapi()
    found: dict[str, tuple[str, str, dict[str, Any]]] = {}
    for path, methods in doc["paths"].items():
        for method, operation in methods.items():
            assert operation["operationId"] not in found, operation["operationId"]
            found[operation["operationId"]] = (method, path, operation)
    return found


def test_every_operation_has_its_pinned_operation_id(
    operations: dict[str, tuple[str, str, dict[str, Any]]],
) -> None:
    where = {op_id: (method, path) for op_id, (method, path, _) in operations.items()}
    pinned = {op_id: (method, path) for op_id, (method, path, _) in OPERATIONS.items()}
    assert where == pinned


def test_every_error_an_operation_can_answer_is_documented_with_the_error_model(
    operations: dict[str, tuple[str, str, dict[str, Any]]],
) -> None:
    for op_id, (_, _, statuses) in OPERATIONS.items():
        responses = operations[op_id][2]["responses"]
        documented = {int(status) for status in responses if status[0] in "45"}
        assert documented == statuses, op_id
        for status in documented - {503} if op_id == "health-readyz" else documented:
            schema = responses[str(status)]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ApiError"}, (op_id, status)


def test_streams_and_metrics_say_their_media_type(
    operations: dict[str, tuple[str, str, dict[str, Any]]],
) -> None:
    for op_id, media_type in MEDIA_TYPES.items():
        success = next(v for k, v in operations[op_id][2]["responses"].items() if k[0] == "2")
        assert list(success["content"]) == [media_type], op_id
