"""Webhooks in Redis: their records, the status of their deliveries and their dead letters.

One hash holds every webhook (``<prefix>webhooks``: id -> JSON record), so whoever delivers
them rebuilds its consumers from one read on start. Each webhook's status is a hash of its own
(``<prefix>webhook:<id>:status``), changed field by field, so that a delivery never rewrites the
record, and its recent dead letters a capped list (``<prefix>webhook:<id>:dead``).

A user's webhook is stored only while its tenant's users have fewer than their cap: one Lua
script counts and adds, so two requests at once cannot both take the last place.
"""

from __future__ import annotations

import redis.asyncio as aioredis
from unicron.shared.contracts.webhooks import (
    RECENT_DEAD_LETTERS,
    Webhook,
    WebhookDeadLetter,
    WebhookStatus,
)
from unicron.shared.store.records import parse_each

# KEYS[1]: every webhook; ARGV: the new one's id, its record, its tenant, the cap. 1: stored.
PUT_WITHIN_SCRIPT = """
local held = 0
for _, raw in ipairs(redis.call('HVALS', KEYS[1])) do
  local webhook = cjson.decode(raw)
  if webhook['admin'] == false and webhook['tenant'] == ARGV[3] then held = held + 1 end
end
if held >= tonumber(ARGV[4]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""
_COUNTS = ("delivered", "consecutive_failures", "dead_letters")
_TIMES = ("last_success_at", "last_error_at")


class WebhookStore:
    def __init__(self, client: aioredis.Redis, prefix: str = "unicron:") -> None:
        self._redis = client
        self._all = f"{prefix}webhooks"
        self._prefix = prefix
        self._put_within = client.register_script(PUT_WITHIN_SCRIPT)

    def _status_key(self, webhook_id: str) -> str:
        return f"{self._prefix}webhook:{webhook_id}:status"

    def _dead_key(self, webhook_id: str) -> str:
        return f"{self._prefix}webhook:{webhook_id}:dead"

    async def put(self, webhook: Webhook) -> None:
        await self._redis.hset(self._all, webhook.id, webhook.model_dump_json())

    async def put_within(self, webhook: Webhook, per_tenant: int) -> bool:
        """Store a user's new webhook unless its tenant's users already have ``per_tenant``
        webhooks (an admin's are not counted); False: nothing was stored."""
        assert not webhook.admin and webhook.tenant is not None, "only a user's is counted"
        args: list[str | int] = [webhook.id, webhook.model_dump_json(), webhook.tenant, per_tenant]
        return bool(await self._put_within(keys=[self._all], args=args))

    async def get(self, webhook_id: str) -> Webhook | None:
        raw = await self._redis.hget(self._all, webhook_id)
        return None if raw is None else Webhook.model_validate_json(raw)

    async def all(self) -> list[Webhook]:
        raws = await self._redis.hgetall(self._all)
        found = parse_each(Webhook, "webhook", [str(k) for k in raws], list(raws.values()))
        return sorted(found, key=lambda w: (w.created_at, w.id))

    async def delete(self, webhook_id: str) -> bool:
        """Forget the webhook; its status stays until :meth:`forget_status`."""
        return bool(await self._redis.hdel(self._all, webhook_id))

    async def forget_status(self, webhook_id: str) -> None:
        await self._redis.delete(self._status_key(webhook_id), self._dead_key(webhook_id))

    async def status(self, webhook_id: str) -> WebhookStatus:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self._status_key(webhook_id))
            pipe.lrange(self._dead_key(webhook_id), 0, RECENT_DEAD_LETTERS - 1)
            fields, letters = await pipe.execute()
        return WebhookStatus(
            **{k: int(fields[k]) for k in _COUNTS if k in fields},
            **{k: float(fields[k]) for k in _TIMES if k in fields},
            last_error=fields.get("last_error"),
            recent_dead_letters=[WebhookDeadLetter.model_validate_json(d) for d in letters],
        )

    async def delivered(self, webhook_id: str, at: float) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            key = self._status_key(webhook_id)
            pipe.hincrby(key, "delivered", 1)
            pipe.hset(key, mapping={"last_success_at": at, "consecutive_failures": 0})
            await pipe.execute()

    async def failed(self, webhook_id: str, error: str, at: float) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            key = self._status_key(webhook_id)
            pipe.hincrby(key, "consecutive_failures", 1)
            pipe.hset(key, mapping={"last_error": error, "last_error_at": at})
            await pipe.execute()

    async def dead_lettered(self, letter: WebhookDeadLetter) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(self._status_key(letter.webhook_id), "dead_letters", 1)
            dead = self._dead_key(letter.webhook_id)
            pipe.lpush(dead, letter.model_dump_json())
            pipe.ltrim(dead, 0, RECENT_DEAD_LETTERS - 1)
            await pipe.execute()
