"""Locust scenarios against the gateway (or its load balancer): the user classes of loadtests/scenarios/, their
setup in the `test_start` listener (on the master or the local runner; workers get the secrets in a message), and
their summaries at the end. How to run them, and what each class calls and counts as right: loadtests/README.md.

    GATEWAY_HOME=<home> .venv/bin/locust -f loadtests/locustfile.py --headless -u 20 -r 10 -t 10s --host URL"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `loadtests.`

import gevent  # noqa: E402
from locust import events  # noqa: E402
from locust.runners import MasterRunner, WorkerRunner  # noqa: E402

from loadtests.scenarios import churn, ratelimit  # noqa: E402
from loadtests.scenarios.cached import CachedReadWrite  # noqa: E402,F401
from loadtests.scenarios.churn import ChurnReader, ManagementChurn  # noqa: E402,F401
from loadtests.scenarios.common import STATE, log  # noqa: E402
from loadtests.scenarios.lookup import GovernedLookup, PlainLookup  # noqa: E402,F401
from loadtests.scenarios.page import AccountPage  # noqa: E402,F401
from loadtests.scenarios.provision import PREFIX, ProvisionError, admin_key_from_env, provision  # noqa: E402
from loadtests.scenarios.ratelimit import RateLimited  # noqa: E402,F401
from loadtests.scenarios.write import Deposit, ReadWriteMix  # noqa: E402,F401

SETUP_MESSAGE = 'loadtests:setup'


def _has_task(user_class, tags, exclude) -> bool:
    for task in getattr(user_class, 'tasks', []):
        task_tags = getattr(task, 'locust_tag_set', set())
        if tags is not None and not task_tags & tags:
            continue
        if exclude is not None and task_tags & exclude:
            continue
        return True
    return False


@events.init.add_listener
def on_init(environment, **_kwargs):
    options = environment.parsed_options
    tags = set(options.tags) if options is not None and getattr(options, 'tags', None) else None
    exclude = set(options.exclude_tags) if options is not None and getattr(options, 'exclude_tags', None) else None
    if tags or exclude:
        # --tags picks scenarios: drop the user classes it leaves without a task (locust would spawn them anyway)
        kept = [u for u in environment.user_classes if _has_task(u, tags, exclude)]
        if kept:
            environment.user_classes[:] = kept
    if isinstance(environment.runner, WorkerRunner):
        environment.runner.register_message(SETUP_MESSAGE, lambda msg, **_kw: STATE.load_message(msg.data))


@events.test_start.add_listener
def on_test_start(environment, **_kwargs):
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        return  # the master's setup message arrives before the spawn message
    STATE.counts.clear()
    host = environment.host
    try:
        if not host:
            raise ProvisionError('no --host given')
        admin_key = admin_key_from_env()
        result = provision(host, admin_key)
    except (ProvisionError, OSError) as error:
        log.error('setup failed, nothing will run: %s', error)
        environment.process_exit_code = 2
        STATE.ready.set()  # users stop at once (no secrets) instead of waiting
        if runner is not None:
            gevent.spawn_later(0.1, runner.quit)
        return
    STATE.load_message({**result, 'admin_key': admin_key})
    for note in result['notes']:
        log.info('setup: %s', note)
    if result['writes'] != 'allowed':
        log.warning('setup: writes are %s - Deposit and ReadWriteMix will report every deposit as refused',
                    result['writes'])
    if isinstance(runner, MasterRunner):
        runner.send_message(SETUP_MESSAGE, STATE.to_message())


@events.test_stop.add_listener
def on_test_stop(environment, **_kwargs):
    for line in (ratelimit.summary(), churn.summary()):
        if line:
            log.info('summary: %s', line)
    if STATE.counts.get('writes_refused'):
        log.error('summary: %d deposits were refused (403 write_not_allowed): the server needs '
                  'GATEWAY_ALLOW_WRITES=1', STATE.counts['writes_refused'])
    if STATE.counts.get('cache_hit') or STATE.counts.get('cache_miss'):
        log.info('summary: cached reads: %d hits, %d misses, %d stale', STATE.counts.get('cache_hit', 0),
                 STATE.counts.get('cache_miss', 0), STATE.counts.get('stale_cached', 0))
    if STATE.counts.get('stale_cached'):
        log.error('summary: STALE cached answers after a write through the gateway (see the failures)')
    if STATE.counts.get('stale_answers') or STATE.counts.get('stale_keys'):
        log.error('summary: STALE state served after a management call had returned (see the failures)')
    if not isinstance(environment.runner, WorkerRunner) and STATE.admin_key and environment.host:
        _delete_leftover_victims(environment.host)


def _delete_leftover_victims(host: str):
    """Keys of a churn cycle cut short by the end of the run."""
    from fleet.ops.local.seed import Api
    try:
        api = Api(host, STATE.admin_key)
        status, body = api.call('GET', '/api/v1/api-keys')
        if status != 200:
            return
        for item in body.get('items', []):
            if item.get('name', '').startswith(f'{PREFIX}-victim-'):
                api.call('DELETE', f'/api/v1/api-keys/{item["name"]}')
    except OSError:
        pass
