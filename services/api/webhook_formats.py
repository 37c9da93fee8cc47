"""The body a webhook receives for one event, in its format (:class:`WebhookFormat`).

``cloudevents``: the event itself, CloudEvents 1.0 structured JSON. ``slack``: ``{"text": ...}``
with one line a person reads (job, node, failure category, action). ``alertmanager``: the
payload Alertmanager's webhook receiver sends (version 4), one alert per event; a failure or a
lost node fires, every other event is resolved, so a receiver that keeps alerts by fingerprint
sees a job's failure resolved by its transition.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from unicron.shared.contracts.events import (
    CloudEvent,
    FailureDetected,
    NodeLost,
)
from unicron.shared.contracts.webhooks import Webhook, WebhookFormat

CLOUDEVENTS_TYPE = "application/cloudevents+json"
JSON_TYPE = "application/json"
FIRING_TYPES = (FailureDetected.TYPE, NodeLost.TYPE)
# Alertmanager's "not ended yet".
ZERO_TIME = "0001-01-01T00:00:00Z"
# The label an event's data field becomes, for those a receiver routes or groups by.
_LABELS = {
    "job_id": "job_id", "node_id": "node_id", "rank": "rank", "category": "category",
    "severity": "severity", "action": "action", "kind": "kind", "new": "state",
}  # fmt: skip


def summary(event: CloudEvent) -> str:
    """One line: the type, then what it is about and what happened."""
    data = event.data
    parts: list[str] = []
    for name, key in (("job", "job_id"), ("node", "node_id"), ("rank", "rank")):
        if data.get(key) is not None:
            parts.append(f"{name} {data[key]}")
    if {"old", "new"} <= data.keys():
        parts.append(f"{data['old']} → {data['new']}")
    if data.get("category") is not None:
        parts.append(f"failure {data['category']} ({data.get('severity')})")
    if data.get("action") is not None:
        parts.append(f"action {data['action']}")
    if data.get("reason"):
        parts.append(f"reason: {data['reason']}")
    return f"{event.type}: {', '.join(parts)}" if parts else event.type


def _alert(event: CloudEvent) -> dict[str, Any]:
    labels = {"alertname": "Unicron" + event.type.title().replace(".", "").replace("_", "")}
    for key, label in _LABELS.items():
        if event.data.get(key) is not None:
            labels[label] = str(event.data[key])
    firing = event.type in FIRING_TYPES
    # The job (or node) names the alert: a failure's transition then resolves it.
    identity = event.data.get("job_id") or event.data.get("node_id") or event.id
    fingerprint = hashlib.sha256(f"unicron\0{identity}".encode()).hexdigest()[:16]
    return {
        "status": "firing" if firing else "resolved",
        "labels": labels,
        "annotations": {"summary": summary(event), "event_id": event.id},
        "startsAt": event.time,
        "endsAt": ZERO_TIME if firing else event.time,
        "generatorURL": "",
        "fingerprint": fingerprint,
    }


def alertmanager_payload(webhook: Webhook, event: CloudEvent, external_url: str) -> dict[str, Any]:
    alert = _alert(event)
    group = {"alertname": alert["labels"]["alertname"]}
    return {
        "version": "4",
        "groupKey": f'{{}}:{{alertname="{group["alertname"]}"}}',
        "truncatedAlerts": 0,
        "status": alert["status"],
        "receiver": f"unicron-{webhook.id}",
        "groupLabels": group,
        "commonLabels": alert["labels"],
        "commonAnnotations": alert["annotations"],
        "externalURL": external_url,
        "alerts": [alert],
    }


def render(webhook: Webhook, event: CloudEvent, external_url: str) -> tuple[bytes, str]:
    """The body for ``webhook`` and its content type."""
    if webhook.format == WebhookFormat.SLACK:
        return json.dumps({"text": summary(event)}).encode(), JSON_TYPE
    if webhook.format == WebhookFormat.ALERTMANAGER:
        body = alertmanager_payload(webhook, event, external_url)
        return json.dumps(body).encode(), JSON_TYPE
    return event.model_dump_json(exclude_none=True).encode(), CLOUDEVENTS_TYPE
