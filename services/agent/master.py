"""MASTER_ADDR and MASTER_PORT of an entrypoint job: one fresh torch store per generation.

torch's ``env://`` rendezvous with ``TORCHELASTIC_USE_AGENT_STORE=True`` connects every rank
as a client to ``MASTER_ADDR:MASTER_PORT`` and uses no key prefix, so a generation cannot
reuse the store of the one before. The first agent that needs one for a (job, generation) wins
an atomic ``add`` under the generation's prefix in the rendezvous store
(:mod:`unicron.services.agent.store`), hosts a new TCPStore at its advertised host, on an
OS-assigned port or the first free one of ``UNICRON_STORE_PORTS``, and publishes ``host:port`` under
that prefix; the other agents wait for the key (bounded, in a thread: the store calls block). A
winner that cannot host one (the range is used up) publishes why instead, so every rank's start
is refused with that reason at once rather than after the wait. The hosting agent closes the
store when the generation is stopped or superseded, or when none of its local workers has run
for ``idle_close_s``.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from unicron.services.agent.store import Ports, StorePortsExhaustedError, host_store
from unicron.services.agent.workers import Generation
from unicron.shared.contracts.messages import Rendezvous
from unicron.shared.logging import get_logger

if TYPE_CHECKING:
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

log = get_logger(component="master")
CLAIM_KEY = "torch-master/claim"
ADDRESS_KEY = "torch-master/address"
FAILED = "failed:"  # an address value that says why the winner could not host the store


class MasterUnavailableError(RuntimeError):
    """The generation's master store could not be hosted; the start cannot succeed."""


def _client(rendezvous: Rendezvous, timeout_s: float) -> Any:
    """A client of the rendezvous store under the generation's prefix."""
    from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]

    timeout = timedelta(seconds=timeout_s)
    client = TCPStore(
        rendezvous.host, rendezvous.port, is_master=False, timeout=timeout, use_libuv=True
    )
    return PrefixStore(rendezvous.prefix, client)


def _claim_or_wait(rendezvous: Rendezvous, timeout_s: float) -> tuple[str, int] | None:
    """None when this agent won the claim; else the address the winner published."""
    store = _client(rendezvous, timeout_s)
    if int(store.add(CLAIM_KEY, 1)) == 1:
        return None
    store.wait([ADDRESS_KEY], timedelta(seconds=timeout_s))
    address = bytes(store.get(ADDRESS_KEY)).decode()
    if address.startswith(FAILED):
        raise MasterUnavailableError(address.removeprefix(FAILED))
    host, _, port = address.rpartition(":")
    return host, int(port)


def _publish(rendezvous: Rendezvous, address: str, timeout_s: float) -> None:
    _client(rendezvous, timeout_s).set(ADDRESS_KEY, address)


class MasterStores:
    def __init__(
        self,
        host: str,
        bind_host: str,
        ports: Ports = 0,
        timeout_s: float = 60.0,
        idle_close_s: float = 30.0,
    ) -> None:
        self.host = host
        self.bind_host = bind_host
        self.ports = ports
        self.timeout_s = timeout_s
        self.idle_close_s = idle_close_s
        self._hosted: dict[Generation, TCPStore] = {}
        self._idle_since: dict[Generation, float] = {}
        self._locks: dict[Generation, asyncio.Lock] = {}

    def hosted(self) -> list[Generation]:
        return sorted(self._hosted)

    async def address(
        self, job_id: str, generation: int, rendezvous: Rendezvous
    ) -> tuple[str, int]:
        """MASTER_ADDR and MASTER_PORT of the generation, hosting its store if nobody does."""
        key = (job_id, generation)
        async with self._locks.setdefault(key, asyncio.Lock()):
            store = self._hosted.get(key)
            if store is not None:
                return self.host, int(store.port)
            found = await asyncio.to_thread(_claim_or_wait, rendezvous, self.timeout_s)
            if found is not None:
                return found
            store = await self._host(job_id, generation, rendezvous)
            self.close(job_id, below_generation=generation)  # an older generation is over
            self._hosted[key] = store
            address = f"{self.host}:{int(store.port)}"
            await asyncio.to_thread(_publish, rendezvous, address, self.timeout_s)
        log.info("master store hosted", job_id=job_id, generation=generation, address=address)
        return self.host, int(store.port)

    async def _host(self, job_id: str, generation: int, rendezvous: Rendezvous) -> TCPStore:
        try:
            return await asyncio.to_thread(host_store, self.bind_host, self.ports)
        except StorePortsExhaustedError as exc:
            log.error("master store not hosted", job_id=job_id, generation=generation, why=str(exc))
            failed = f"{FAILED}master store of {job_id} generation {generation}: {exc}"
            await asyncio.to_thread(_publish, rendezvous, failed, self.timeout_s)
            raise MasterUnavailableError(failed.removeprefix(FAILED)) from None

    def close(self, job_id: str, below_generation: int | None = None) -> None:
        """Close the job's stores of generations below ``below_generation`` (None: all)."""
        for key in [k for k in self._hosted if k[0] == job_id]:
            if below_generation is None or key[1] < below_generation:
                self._drop(key)

    def sweep(self, running: set[Generation]) -> None:
        """Close stores whose generation has had no live worker here for ``idle_close_s``."""
        now = time.monotonic()
        for key in list(self._hosted):
            if key in running:
                self._idle_since.pop(key, None)
            elif now - self._idle_since.setdefault(key, now) >= self.idle_close_s:
                self._drop(key)

    def close_all(self) -> None:
        for key in list(self._hosted):
            self._drop(key)

    def _drop(self, key: Generation) -> None:
        # TCPStore has no close(); dropping the last reference stops its server thread.
        self._hosted.pop(key, None)
        self._idle_since.pop(key, None)
        self._locks.pop(key, None)
        log.info("master store closed", job_id=key[0], generation=key[1])
