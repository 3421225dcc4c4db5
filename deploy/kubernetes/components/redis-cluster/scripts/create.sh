#!/bin/sh
# Join the six nodes into one cluster, once (the redis-cluster-create Job). Waits until every
# node answers; does nothing when the first node already knows others (made before).
set -eu
export REDISCLI_AUTH="$REDIS_PASSWORD"
NODES=6
domain="redis-cluster.${NAMESPACE}.svc.cluster.local"
hosts=""
i=0
while [ "$i" -lt "$NODES" ]; do
    host="redis-cluster-$i.$domain"
    until redis-cli -h "$host" ping 2>/dev/null | grep -q PONG; do
        echo "create.sh: waiting for $host" >&2
        sleep 2
    done
    hosts="$hosts $host:6379"
    i=$((i + 1))
done
known=$(redis-cli -h "redis-cluster-0.$domain" cluster info | tr -d '\r' | sed -n 's/^cluster_known_nodes://p')
if [ "${known:-1}" -gt 1 ]; then
    echo "create.sh: the cluster exists ($known nodes known)" >&2
    exit 0
fi
# shellcheck disable=SC2086  # one word per node
redis-cli --cluster create $hosts --cluster-replicas 1 --cluster-yes
