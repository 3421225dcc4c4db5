#!/bin/sh
# A Redis server under Sentinel (components/redis-sentinel). It follows the master the sentinels
# name, if any answers: after a failover the master is another pod, and a server that came back
# as a master on its own would take writes nobody else sees until the sentinels demote it. Only
# when no sentinel answers (the first start) is redis-0 the master and the others its replicas.
set -eu
MASTER=mymaster
domain="redis.${NAMESPACE}.svc.cluster.local"
sentinels="redis-sentinel.${NAMESPACE}.svc.cluster.local"
me="$(hostname).${domain}"

master=""
for i in 0 1 2; do
    master=$(REDISCLI_AUTH="$REDIS_PASSWORD" timeout 3 redis-cli -h "redis-sentinel-$i.$sentinels" -p 26379 \
                 --raw SENTINEL get-master-addr-by-name "$MASTER" 2>/dev/null | head -n 1) || master=""
    [ -n "$master" ] && break
done
[ -n "$master" ] || master="redis-0.${domain}"
echo "redis.sh: master is $master" >&2

# The replica announces its DNS name (the sentinels resolve it), not the pod's IP.
set -- redis-server --port 6379 --dir /data --appendonly yes --maxmemory-policy noeviction \
    --requirepass "$REDIS_PASSWORD" --masterauth "$REDIS_PASSWORD" --replica-announce-ip "$me"
if [ "$master" != "$me" ]; then
    set -- "$@" --replicaof "$master" 6379
fi
exec "$@"
