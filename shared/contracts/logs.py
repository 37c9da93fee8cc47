"""Reading a worker's output through its node's agent: the request/reply pair on
``unicron.agents.<node>.logs`` (core NATS request/reply, like the ping).

A worker's stdout and stderr go to one file per launch on its node; the API cannot read it,
so it asks the node's agent for a chunk: from a byte ``offset``, or the last ``tail`` lines.
The reply carries at most ``LOGS_CHUNK_BYTES`` of raw bytes, base64 in JSON, so a reply stays
well under NATS's 1 MB payload limit whatever the output holds. Following a log is asking
again from ``next_offset`` until the worker has stopped and everything has been read.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field
from unicron.shared.contracts.messages import Message

LOGS_CHUNK_BYTES = 256 * 1024  # base64 makes it ~342 KiB of JSON: far below 1 MB
MAX_TAIL_LINES = 10_000


def logs_subject(node_id: str) -> str:
    """Core-NATS request/reply subject where an agent serves its workers' output."""
    return f"unicron.agents.{node_id}.logs"


class LogsRequest(Message):
    """API → agent: a chunk of the output of the process that served as ``rank`` in
    ``generation`` of the job (the agent finds it, even if it re-formed in place since)."""

    job_id: str = Field(max_length=128)
    generation: int = Field(ge=0)
    rank: int = Field(ge=0)
    offset: int | None = Field(None, ge=0, description="read from this byte; else use tail")
    tail: int | None = Field(
        None, ge=0, le=MAX_TAIL_LINES, description="start at the last N lines (no offset)"
    )
    max_bytes: int = Field(LOGS_CHUNK_BYTES, ge=0, le=LOGS_CHUNK_BYTES)


class LogsReply(Message):
    """Agent → API: ``data`` is the file's bytes from ``offset`` to ``next_offset``."""

    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    found: bool = Field(description="the node has output (or a live process) for this rank")
    running: bool = Field(
        False, description="its process was alive before the read: more output may come"
    )
    data: bytes = b""
    offset: int = 0
    next_offset: int = 0
    size: int = Field(0, description="the file's size when it was read")
    error: str | None = Field(None, description="why the agent refused the request")

    @property
    def complete(self) -> bool:
        """Nothing more will ever be written, and this reply read up to the end."""
        return not self.running and self.next_offset >= self.size
