#!/bin/sh
# Entrypoint of the gateway-fleet image (compose/Dockerfile).
#
#   serve (the default)  run the gateway: gunicorn -c fleet/server/gunicorn_conf.py 'fleet.app:create_app()'
#   anything else        run that command (`fleet seed ...`, `locust ...`, `python ...`)
#
# For `serve` it does three things gunicorn_conf.py cannot know inside a container:
#
# 1. Workers = the CPUs the container is given. `cpus:` / `deploy.resources.limits.cpus`
#    is a CFS quota, which os.sched_getaffinity() (what gunicorn_conf counts when
#    GATEWAY_WORKERS is unset) does not see: it would start one worker per *host* core and
#    pin every replica's workers to the same first cores. So when a quota smaller than the
#    affinity set is in force and GATEWAY_WORKERS is unset (or 0), this exports
#    GATEWAY_WORKERS=ceil(quota) and, unless GATEWAY_CPUS is set, GATEWAY_CPUS=off.
#    A cpuset (`cpuset:` / --cpuset-cpus) is seen by gunicorn_conf as it is: workers are
#    pinned to those cores.
# 2. Waits (up to FLEET_WAIT_SECONDS, default 60) until the store and Redis accept TCP
#    connections: Swarm ignores depends_on, and a worker that cannot reach the store at
#    boot stops the master.
# 3. Drains on SIGTERM: keeps serving for FLEET_DRAIN_SECONDS (default 6; nginx
#    re-resolves the replicas every 5 s), then passes SIGTERM to gunicorn, which stops
#    accepting and finishes its requests in flight (graceful_timeout 30 s). The compose
#    file's stop_grace_period (45 s) covers both.
set -eu

if [ "$#" -gt 0 ] && [ "$1" != "serve" ]; then
    exec "$@"
fi

cpu_quota() {  # prints ceil(quota / period), or nothing when no quota is set
    if [ -r /sys/fs/cgroup/cpu.max ]; then                       # cgroup v2
        read -r quota period < /sys/fs/cgroup/cpu.max
    elif [ -r /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then        # cgroup v1
        read -r quota < /sys/fs/cgroup/cpu/cpu.cfs_quota_us
        read -r period < /sys/fs/cgroup/cpu/cpu.cfs_period_us
    else
        return 0
    fi
    case "$quota" in max|-1|"") return 0 ;; esac
    echo $(( (quota + period - 1) / period ))
}

if [ "${GATEWAY_WORKERS:-0}" = "0" ]; then
    quota=$(cpu_quota)
    if [ -n "$quota" ] && [ "$quota" -lt "$(nproc)" ]; then
        export GATEWAY_WORKERS="$quota"
        if [ -z "${GATEWAY_CPUS:-}" ]; then
            export GATEWAY_CPUS=off
        fi
        echo "entrypoint: CPU quota of $quota core(s): GATEWAY_WORKERS=$GATEWAY_WORKERS GATEWAY_CPUS=$GATEWAY_CPUS" >&2
    fi
fi

python - <<'PY'
import os, socket, sys, time
from urllib.parse import urlsplit

deadline = time.monotonic() + float(os.environ.get("FLEET_WAIT_SECONDS") or 60)
for var, default_port in (("GATEWAY_DATABASE_URL", 5432), ("GATEWAY_REDIS_URL", 6379)):
    try:
        url = urlsplit(os.environ.get(var, ""))
        host, port = url.hostname, url.port or default_port
    except ValueError:      # several hosts, a socket path...: let the gateway handle it
        continue
    if not host:
        continue
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                sys.exit(f"entrypoint: {var} host {host}:{port} is unreachable ({exc})")
            time.sleep(1)
PY

python -m gunicorn -c fleet/server/gunicorn_conf.py 'fleet.app:create_app()' &
child=$!

drain() {
    sleep "${FLEET_DRAIN_SECONDS:-6}"
    kill -TERM "$child" 2>/dev/null || true
}
trap drain TERM
trap 'kill -INT "$child" 2>/dev/null || true' INT

# `wait` returns early when a trapped signal arrives: keep waiting until gunicorn is gone.
status=0
while kill -0 "$child" 2>/dev/null; do
    wait "$child" && status=0 || status=$?
done
exit "$status"
