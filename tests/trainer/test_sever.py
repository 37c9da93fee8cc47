"""A regroup that names lost hosts frees a worker blocked on a peer that will never answer."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from unicron.shared.contracts.messages import RegroupDirective, Rendezvous
from unicron.trainer.regroup import RegroupInbox
from unicron.trainer.sever import connections_to


@pytest.fixture
def silent_peer() -> Iterator[socket.socket]:
    """A connection to a peer on 127.0.0.1 that never sends: like one behind a cut link."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        with client, peer:
            yield client


def regroup(generation: int, lost: list[str]) -> RegroupDirective:
    rendezvous = Rendezvous(host="127.0.0.2", port=1, prefix=f"j/g{generation}/")
    return RegroupDirective(
        job_id="j", generation=generation, rank=0, world_size=1, rendezvous=rendezvous,
        lost_hosts=lost,
    )  # fmt: skip


def blocked_read(conn: socket.socket) -> tuple[threading.Thread, list[bytes]]:
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(conn.recv(1)), daemon=True)
    reader.start()
    return reader, got


def test_a_regroup_naming_the_lost_host_ends_the_blocked_read(silent_peer: socket.socket) -> None:
    reader, got = blocked_read(silent_peer)
    inbox = RegroupInbox("j", generation=1)
    inbox.offer(regroup(2, lost=["10.9.9.9"]))  # another host: this connection stays
    reader.join(0.3)
    assert reader.is_alive() and silent_peer.fileno() in connections_to(["127.0.0.1"])
    inbox.offer(regroup(3, lost=["127.0.0.1"]))
    reader.join(5)
    assert got == [b""]  # end of stream, as a peer's reset would have given
    assert inbox.take() is not None  # and the directive waits for the worker


def test_a_stale_regroup_severs_nothing(silent_peer: socket.socket) -> None:
    reader, _ = blocked_read(silent_peer)
    inbox = RegroupInbox("j", generation=4)
    inbox.offer(regroup(3, lost=["127.0.0.1"]))
    reader.join(0.3)
    assert reader.is_alive()
    silent_peer.shutdown(socket.SHUT_RDWR)
