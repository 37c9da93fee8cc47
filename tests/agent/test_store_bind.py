"""The node's rendezvous store listens on the advertised address only (issue 11): a store on
every interface would let anyone who can reach the machine join or poison a rendezvous."""

from __future__ import annotations

import socket

import pytest
from unicron.services.agent.store import RendezvousStore


def _connects(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


async def test_the_store_answers_on_its_address_and_nowhere_else() -> None:
    store = RendezvousStore("127.0.0.1")
    port = await store.start()
    try:
        assert _connects("127.0.0.1", port)
        # 127.0.0.2 reaches this machine too: only a socket bound to every address answers it
        assert not _connects("127.0.0.2", port)
        assert not _connects("::1", port)
    finally:
        store.close()


async def test_an_address_this_machine_does_not_have_is_a_clear_error() -> None:
    with pytest.raises(OSError, match=r"[Cc]annot assign|not available"):
        await RendezvousStore("192.0.2.1").start()  # TEST-NET-1: nobody's address
