"""A JetStream message as a delivery reads it, recording what became of it (ack, term, nak)."""

from __future__ import annotations

from unicron.shared.bus.lane import MSG_ID


class RecordedMsg:
    def __init__(self, subject: str, data: bytes, msg_id: str | None = None) -> None:
        self.subject = subject
        self.data = data
        self.metadata = None
        self.headers: dict[str, str] | None = None if msg_id is None else {MSG_ID: msg_id}
        self.outcomes: list[str] = []

    async def ack(self) -> None:
        self.outcomes.append("ack")

    async def term(self) -> None:
        self.outcomes.append("term")

    async def nak(self, delay: float | None = None) -> None:
        self.outcomes.append("nak")

    async def in_progress(self) -> None:
        self.outcomes.append("in_progress")
