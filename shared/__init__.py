"""Unicron's common layer, one subpackage per concept (CONTRIBUTING.md has the map).

- :mod:`unicron.shared.contracts`: every message and record as one pydantic model, the failure
  taxonomy and the lifecycles; no I/O.
- :mod:`unicron.shared.bus`: NATS JetStream (streams, publishing, delivery, logins); its public
  face is :mod:`unicron.shared.bus.api`.
- :mod:`unicron.shared.store`: Redis (records, the state store, replication, Sentinel, leases);
  its public face is :mod:`unicron.shared.store.api`.
- :mod:`unicron.shared.servers`: local NATS and Redis servers and their credentials.
- The modules beside them: settings, the service run loop, logging, outages, addresses.
"""
