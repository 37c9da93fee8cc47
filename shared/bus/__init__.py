"""The bus on NATS JetStream: streams and subjects, publishing with de-duplication, durable
delivery, logins and permissions. Services hold :class:`unicron.shared.bus.api.EventBus`."""
