#!/bin/sh
# Writes /run/sentinel/sentinel.conf for this Sentinel (redis-sentinel.yaml). Sentinel keeps
# its own state in that file; a restarted one asks its peers for the current primary.
set -eu
umask 077
self="$(hostname).redis-sentinel-headless"
primary=""
for peer in redis-sentinel-0 redis-sentinel-1 redis-sentinel-2; do
  [ "$peer" = "$(hostname)" ] && continue
  primary=$(timeout 3 redis-cli -h "$peer.redis-sentinel-headless" -p 26379 \
    -a "$REDIS_SENTINEL_PASSWORD" --no-auth-warning \
    sentinel get-master-addr-by-name unicron 2>/dev/null | head -n 1 || true)
  case "$primary" in ""|*rror*|*ERR*) primary="" ;; *) break ;; esac
done
[ -n "$primary" ] || primary=redis-0.redis-headless
cat > /run/sentinel/sentinel.conf <<CONF
port 26379
dir /run/sentinel
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel announce-ip $self
requirepass $REDIS_SENTINEL_PASSWORD
sentinel sentinel-pass $REDIS_SENTINEL_PASSWORD
sentinel monitor unicron $primary 6379 2
sentinel auth-user unicron sentinel
sentinel auth-pass unicron $REDIS_SENTINEL_PASSWORD
sentinel down-after-milliseconds unicron 5000
sentinel failover-timeout unicron 60000
sentinel parallel-syncs unicron 1
CONF
echo "sentinel-init: $self monitors $primary"
