#!/bin/sh
# Writes /run/redis/redis.conf and /run/redis/users.acl for this Redis pod (redis.yaml).
# The primary is whoever the Sentinels say it is; with no Sentinel answering (first start),
# redis-0. Sentinel rewrites the file (CONFIG REWRITE) when it promotes or repoints a replica.
set -eu
umask 077
digest() { printf '%s' "$1" | sha256sum | cut -d' ' -f1; }
{
  cat /secrets/acl/users.acl
  echo "user replication on #$(digest "$REDIS_REPLICATION_PASSWORD") +psync +replconf +ping"
  echo "user sentinel on #$(digest "$REDIS_SENTINEL_PASSWORD") allchannels +multi +slaveof" \
    "+ping +exec +subscribe +config|rewrite +role +publish +info +client|setname" \
    "+client|kill +script|kill"
} > /run/redis/users.acl

self="$(hostname).redis-headless"
primary=$(timeout 5 redis-cli -h redis-sentinel -p 26379 -a "$REDIS_SENTINEL_PASSWORD" \
  --no-auth-warning sentinel get-master-addr-by-name unicron 2>/dev/null | head -n 1 || true)
case "$primary" in ""|*rror*|*ERR*) primary=redis-0.redis-headless ;; esac
{
  echo "include /etc/redis/redis.conf"
  echo "aclfile /run/redis/users.acl"
  echo "masteruser replication"
  echo "masterauth $REDIS_REPLICATION_PASSWORD"
  echo "replica-announce-ip $self"
  if [ "$primary" != "$self" ]; then echo "replicaof $primary 6379"; fi
} > /run/redis/redis.conf
echo "redis-init: $self starts as $([ "$primary" = "$self" ] && echo primary || echo "replica of $primary")"
