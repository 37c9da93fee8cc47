"""The JetStream streams and the wildcard subjects they hold: one definition for the bus that
creates them (:mod:`unicron.shared.bus.bus`), its in-memory twin (:mod:`tests.twins.memorybroker`),
the permission table (:mod:`unicron.shared.bus.natsauth`) and the services that read a stream whole.

A single message's subject is made where its message is defined:
:func:`unicron.shared.contracts.events.event_subject`,
:func:`unicron.shared.contracts.messages.command_subject`,
:func:`unicron.shared.contracts.reports.report_subject`.
"""

from __future__ import annotations

from unicron.shared.contracts.events import EVENT_SUBJECT_PREFIX
from unicron.shared.contracts.messages import DEADLETTER_SUBJECT
from unicron.shared.contracts.reports import REPORT_SUBJECT_PREFIX

EVENTS_STREAM = "UNICRON_EVENTS"
COMMANDS_STREAM = "UNICRON_COMMANDS"
REPORTS_STREAM = "UNICRON_REPORTS"
DEADLETTER_STREAM = "UNICRON_DEADLETTER"

ALL_EVENTS = EVENT_SUBJECT_PREFIX + ">"
ALL_REPORTS = REPORT_SUBJECT_PREFIX + ">"
# Wider than unicron.shared.contracts.messages.COMMAND_SUBJECT_PREFIX: the stream takes any command
# kind.
ALL_COMMANDS = "unicron.commands.>"

STREAMS: dict[str, list[str]] = {
    EVENTS_STREAM: [ALL_EVENTS],
    COMMANDS_STREAM: [ALL_COMMANDS],
    REPORTS_STREAM: [ALL_REPORTS],
    DEADLETTER_STREAM: [DEADLETTER_SUBJECT],
}
REPORTS_MAX_AGE_S = 24 * 3600.0
# Every agent holds one durable consumer on the commands stream; nats-server refuses a stream's
# consumer beyond its max_consumers, 1,000 when the stream does not say (measured on 2.15 by
# bench/scale.py: a cluster of more than ~1,000 nodes could not start its agents).
COMMANDS_MAX_CONSUMERS = 100_000


def reports_of_kind(kind: str) -> str:
    """Every node's reports of one ``kind`` (a report model's ``kind``, e.g. ``worker_exited``)."""
    return f"{REPORT_SUBJECT_PREFIX}*.{kind}"
