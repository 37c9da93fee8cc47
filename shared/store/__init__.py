"""The state store on Redis: records under optimistic transactions, the job index, leases,
replicated writes and Sentinel. Services hold :class:`unicron.shared.store.api.JobStore`."""
