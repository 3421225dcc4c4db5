"""The oltp block's run: every target of --targets started by the harness on its own core (--target-cpu), with its
store in its own database on the same PostgreSQL as the data (peer: qagstore, ours: gwstore, base: gwbase, recreated
empty unless --keep-stores), provisioned through its Management API with the same bodies (loadtests/targets.py);
then the closed-loop rounds (loadtests/harness.py's run_rounds)."""
from __future__ import annotations

from ... import peer, system, targets
from ...harness import log, run_rounds

STORE_DB = {'peer': 'qagstore', 'gateway': 'gwstore', 'base': 'gwbase'}


def run(run):
    args = run.args
    live, redis_url = [], args.redis_url
    for name in args.targets:
        store_url = system.dsn_with_db(args.database_url, STORE_DB[name])
        system.recreate_database(args.database_url, STORE_DB[name], drop=not args.keep_stores)
        log(f'starting {name} (store {system.redact(store_url)}, CPU {args.target_cpu})')
        if name == 'peer':
            target = peer.start(port=args.peer_port, cpu=args.target_cpu, store_url=store_url, run_dir=run.work_dir,
                                extra_env={'QUERYAPIGATE_METADATA_CACHE_TTL': str(args.peer_cache_ttl)})
            target.info['versions'] = peer.installed()
        else:
            if not redis_url:
                process, redis_url = targets.start_redis(port=args.redis_port, cpu=args.pg_cpu, run_dir=run.work_dir)
                run.cleanup.append(process)
                log(f'started redis-server at {redis_url} (CPU {args.pg_cpu})')
            base = name == 'base'   # the same gateway from another checkout (--base-root), measured in the same run
            target = targets.start_gateway(port=args.base_port if base else args.gateway_port, cpu=args.target_cpu,
                                           store_url=store_url, redis_url=redis_url, run_dir=run.work_dir,
                                           root=args.base_root if base else args.gateway_root, name=name)
            run.cleanup.append(target.process)
            targets.wait_healthy(target)
        if target.process not in run.cleanup:
            run.cleanup.append(target.process)
        target.info['provisioned'] = steps = targets.provision(target, args.database_url)
        log(f'{name} ready at {target.base_url} (pid {target.pids[0]}): {steps["probe"][:80]}')
        live.append(target)
    run.meta['targets'] = [t.summary() for t in live]
    run.save()
    run_rounds(run.block, live, args)
