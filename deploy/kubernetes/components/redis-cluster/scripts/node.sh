#!/bin/sh
# A Redis Cluster node (components/redis-cluster). It announces its DNS name to clients, so a
# redirect (MOVED) names a host that survives the pod's IP; nodes.conf lives on its volume.
set -eu
exec redis-server --port 6379 --dir /data --appendonly yes --maxmemory-policy noeviction \
    --cluster-enabled yes --cluster-config-file /data/nodes.conf --cluster-node-timeout 5000 \
    --cluster-announce-hostname "$(hostname).redis-cluster.${NAMESPACE}.svc.cluster.local" \
    --cluster-preferred-endpoint-type hostname \
    --requirepass "$REDIS_PASSWORD" --masterauth "$REDIS_PASSWORD"
