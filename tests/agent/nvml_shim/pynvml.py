"""A ``pynvml`` for an agent process of the CPU tests: the recorded H200 of
``tests/agent/fakenvml.py`` as the module the agent imports, so a real agent process runs its
GPU health watch on a machine without a GPU. A test puts this folder (and the repository root)
on the agent's ``PYTHONPATH`` and fires an Xid by writing ``"<gpu> <xid>"`` to the file named
by ``UNICRON_TEST_XID_FILE``: the next event wait reads it, removes it and returns the event,
as NVML's wait returns one the driver raised."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.agent.fakenvml import FakeEventData, FakeNvml

XID_FILE_ENV = "UNICRON_TEST_XID_FILE"


class _ScriptedNvml(FakeNvml):
    def nvmlEventSetWait_v2(self, _set: object, timeout_ms: int, /) -> FakeEventData:
        order = Path(os.environ.get(XID_FILE_ENV, "/nonexistent"))
        if order.exists():
            gpu, xid = (int(word) for word in order.read_text().split())
            order.unlink()
            self.xid(gpu, xid)
        return super().nvmlEventSetWait_v2(_set, timeout_ms)


_NVML = _ScriptedNvml.h200()


def __getattr__(name: str) -> Any:
    return getattr(_NVML, name)
