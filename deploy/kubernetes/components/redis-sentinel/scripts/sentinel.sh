#!/bin/sh
# A sentinel (components/redis-sentinel). Its configuration is written afresh at each start
# into a writable volume (a sentinel rewrites its file as it learns): it monitors the master
# the other sentinels name now, or redis-0 when none answers (the first start).
set -eu
MASTER=mymaster
QUORUM=2
domain="redis.${NAMESPACE}.svc.cluster.local"
sentinels="redis-sentinel.${NAMESPACE}.svc.cluster.local"
me="$(hostname).${sentinels}"

master=""
for i in 0 1 2; do
    peer="redis-sentinel-$i.$sentinels"
    [ "$peer" = "$me" ] && continue
    master=$(REDISCLI_AUTH="$REDIS_PASSWORD" timeout 3 redis-cli -h "$peer" -p 26379 \
                 --raw SENTINEL get-master-addr-by-name "$MASTER" 2>/dev/null | head -n 1) || master=""
    [ -n "$master" ] && break
done
[ -n "$master" ] || master="redis-0.${domain}"
echo "sentinel.sh: monitoring $master" >&2

conf=/etc/sentinel/sentinel.conf
{
    echo "port 26379"
    echo "dir /tmp"
    # Names, not IPs: pods come back with new addresses.
    echo "sentinel resolve-hostnames yes"
    echo "sentinel announce-hostnames yes"
    echo "sentinel announce-ip $me"
    echo "requirepass $REDIS_PASSWORD"
    echo "sentinel sentinel-pass $REDIS_PASSWORD"
    echo "sentinel monitor $MASTER $master 6379 $QUORUM"
    echo "sentinel auth-pass $MASTER $REDIS_PASSWORD"
    echo "sentinel down-after-milliseconds $MASTER 5000"
    echo "sentinel failover-timeout $MASTER 60000"
    echo "sentinel parallel-syncs $MASTER 1"
} > "$conf"
chmod 600 "$conf"
exec redis-server "$conf" --sentinel
