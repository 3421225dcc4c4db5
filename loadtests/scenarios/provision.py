"""The saved queries and API keys of the load-test scenarios, created through the Management API.

    python -m loadtests.scenarios.provision --url http://127.0.0.1:8000 --out .bench/keys.env

writes the secrets as shell assignments (KEY_PLAIN=gw_..., ...) for loadtests/oha/run.sh or wrk; the locust file
calls provision() itself in its test_start listener. The admin key comes from GATEWAY_ADMIN_KEY (or
<GATEWAY_HOME>/admin_key). Two data connections, each reused when it exists (``fleet up`` and ``fleet seed`` make
both), else created from GATEWAY_DEMO_PG_* (connection_body): the reads' (``demo``, LOADTEST_CONNECTION) and the
deposit's (``demo_writer``, LOADTEST_WRITE_CONNECTION: a role that may only run it). A password not given is saved
as its ``${...}`` reference, which the server resolves from its own environment. The queries and keys (queries(),
keys(); keys are made anew every run, a secret is shown once) are tabled in loadtests/README.md;
LOADTEST_GOVERNED_QUERY and LOADTEST_GOVERNED_GRANTS (JSON) are merged into the governed query's and key's bodies."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from fleet.ops.local.seed import Api

CONNECTION = os.environ.get('LOADTEST_CONNECTION', 'demo')
WRITE_CONNECTION = os.environ.get('LOADTEST_WRITE_CONNECTION', 'demo_writer')
PREFIX = os.environ.get('LOADTEST_KEY_PREFIX', 'lt')
RATE_LIMIT = os.environ.get('LOADTEST_RATE_LIMIT', '20/second')
HUGE_RATE = '1000000/second'
HUGE_QUOTA = {'calls': 1_000_000_000_000, 'per': 'day'}

ACCOUNT_SQL = 'SELECT aid, bid, abalance FROM pgbench_accounts WHERE aid = :aid'
PAGE_SQL = ('SELECT a.aid, a.abalance, b.bid, b.bbalance FROM pgbench_accounts a '
            'JOIN pgbench_branches b ON b.bid = a.bid WHERE a.aid BETWEEN :start AND :start + 99 ORDER BY a.aid')
DEPOSIT_SQL = 'UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid'
PAGE_SIZE = 100

AID = {'type': 'int', 'required': True, 'min': 1, 'description': 'account id'}


def versioned_sql(version: int) -> str:
    """Version N of account_versioned answers N in its `version` column. Odd and even versions differ in shape
    too (a different expression), so a publish really swaps the statement the workers prepare."""
    balance = 'abalance' if version % 2 else 'abalance + 0 AS abalance'
    return f'SELECT aid, {balance}, {int(version)} AS version FROM pgbench_accounts WHERE aid = :aid'


def _json_env(name: str) -> dict:
    raw = os.environ.get(name, '').strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as error:
        raise SystemExit(f'{name} is not JSON: {error}') from None
    if not isinstance(value, dict):
        raise SystemExit(f'{name} must be a JSON object')
    return value


def queries(connection: str = CONNECTION, write_connection: str = WRITE_CONNECTION) -> dict[str, dict]:
    base = {'connection_name': connection, 'publish': True, 'tags': ['loadtest']}
    return {
        'account': {**base, 'sql': ACCOUNT_SQL, 'parameters': {'aid': AID},
                    'description': 'One pgbench account by primary key'},
        'account_governed': {**base, 'sql': ACCOUNT_SQL, 'parameters': {'aid': AID},
                             'description': 'The lookup, for a governed key', **_json_env('LOADTEST_GOVERNED_QUERY')},
        'account_page': {**base, 'sql': PAGE_SQL,
                         'parameters': {'start': {'type': 'int', 'required': True, 'min': 1}},
                         'description': '100 accounts from :start, with their branch'},
        'deposit': {**base, 'connection_name': write_connection, 'sql': DEPOSIT_SQL,
                    'parameters': {'aid': AID, 'delta': {'type': 'int', 'required': True, 'min': 1, 'max': 9}},
                    'description': 'Add :delta to one account (a write)'},
        'account_cached': {**base, 'sql': ACCOUNT_SQL, 'parameters': {'aid': AID}, 'cache_ttl': 60,
                           'description': 'The lookup, cached for 60 s (CachedReadWrite checks it after writes)'},
        'account_versioned': {**base, 'sql': versioned_sql(1), 'parameters': {'aid': AID},
                              'description': 'The lookup; version N answers N (management churn)'},
    }


def keys(connection: str = CONNECTION, write_connection: str = WRITE_CONNECTION) -> dict[str, dict]:
    """scenario -> key body."""
    conn = [connection]
    both = list(dict.fromkeys([connection, write_connection]))
    return {
        'plain': {'name': f'{PREFIX}-plain', 'queries': ['account', 'account_page'], 'connections': conn},
        'governed': {'name': f'{PREFIX}-governed', 'queries': ['account_governed'], 'connections': conn,
                     'rate_limit': HUGE_RATE, 'quota': HUGE_QUOTA, **_json_env('LOADTEST_GOVERNED_GRANTS')},
        'writer': {'name': f'{PREFIX}-writer', 'queries': ['deposit', 'account', 'account_cached'], 'connections': both,
                   'allow_writes': True},
        'limited': {'name': f'{PREFIX}-limited', 'queries': ['account'], 'connections': conn,
                    'rate_limit': RATE_LIMIT, 'rate_limit_burst': rate_limit_number(RATE_LIMIT)},
        'churn': {'name': f'{PREFIX}-churn-reader', 'queries': ['account_versioned'], 'connections': conn},
    }


def rate_limit_number(text: str) -> int:
    return int(text.split('/', 1)[0].strip())


class ProvisionError(RuntimeError):
    pass


def admin_key_from_env() -> str:
    key = os.environ.get('GATEWAY_ADMIN_KEY', '').strip()
    if key:
        return key
    home = Path(os.environ.get('GATEWAY_HOME', '.fleet'))
    path = home / 'admin_key'
    if path.exists():
        return path.read_text().strip()
    raise ProvisionError('no admin key: set GATEWAY_ADMIN_KEY (or GATEWAY_HOME to the folder holding admin_key)')


def connection_body(name: str = CONNECTION, writer: bool = False) -> dict:
    """The body of a data connection to create: the reads' (``demo_reader``) or, with ``writer``, deposit's
    (``demo_writer``), from the GATEWAY_DEMO_* environment (the module's docstring)."""
    env = os.environ
    host = env.get('GATEWAY_DEMO_PG_HOST')
    prefix = 'GATEWAY_DEMO_WRITER_PG' if writer else 'GATEWAY_DEMO_PG'
    if not host:
        hint = f' (or LOADTEST_{"WRITE_" if writer else ""}CONNECTION to an existing one)'
        raise ProvisionError(f'connection {name!r} does not exist and GATEWAY_DEMO_PG_HOST is not set: set '
                             f'GATEWAY_DEMO_PG_HOST/PORT/DATABASE, {prefix}_USER (and {prefix}_PASSWORD) to create '
                             f'it{hint}; `fleet up` and `fleet seed` create demo and demo_writer')
    return {'name': name, 'db': 'postgres', 'host': host, 'port': int(env.get('GATEWAY_DEMO_PG_PORT', '5432')),
            'database': env.get('GATEWAY_DEMO_PG_DATABASE', 'demo'),
            'user': env.get(f'{prefix}_USER', 'demo_writer' if writer else 'demo_reader'),
            'password': env.get(f'{prefix}_PASSWORD') or f'${{{prefix}_PASSWORD}}', 'active': True}


def _expect(what: str, status: int, body, ok=(200, 201)):
    if status not in ok:
        raise ProvisionError(f'{what} answered {status}: {str(body)[:400]}')


def ensure_connection(api: Api, name: str = CONNECTION, writer: bool = False) -> str:
    status, body = api.call('GET', f'/api/v1/connections/{name}')
    if status == 200:
        return (f'connection {name}: exists, reused ({body.get("user")}@{body.get("host")}:{body.get("port")}/'
                f'{body.get("database")})')
    status, body = api.call('POST', '/api/v1/connections', connection_body(name, writer))
    _expect(f'creating connection {name}', status, body, ok=(201, 409))
    return f'connection {name}: created'


def ensure_query(api: Api, name: str, body: dict) -> dict:
    """Create the query if it is missing; a query that exists must serve the same SQL on the same connection
    (account_versioned excepted: churn adds versions to it). Returns the query document."""
    status, doc = api.call('POST', '/api/v1/queries', {'name': name, **body})
    if status == 201:
        return doc
    _expect(f'creating query {name}', status, doc, ok=(409,))
    status, doc = api.call('GET', f'/api/v1/queries/{name}')
    _expect(f'reading query {name}', status, doc)
    published = doc.get('published_version')
    versions = {v['version']: v for v in doc.get('versions', [])}
    if name == 'account_versioned':
        if published is None or versions.get(published, {}).get('sql') != versioned_sql(published):
            # not (or no longer) the shape churn expects: publish a fresh version that answers its own number
            latest = doc.get('latest_version') or 0
            status, doc = api.call('POST', f'/api/v1/queries/{name}/versions',
                                   {**body, 'sql': versioned_sql(latest + 1), 'publish': True})
            _expect(f'adding a version to {name}', status, doc)
        return doc
    current = versions.get(published) if published else None
    if (current is None or current.get('sql') != body['sql']
            or current.get('connection_name') != body['connection_name']):
        status, doc = api.call('POST', f'/api/v1/queries/{name}/versions', {**body, 'publish': True})
        _expect(f'publishing our version of {name}', status, doc)
    return doc


def recreate_key(api: Api, body: dict) -> str:
    name = body['name']
    status, doc = api.call('POST', '/api/v1/api-keys', body)
    if status == 409:
        api.call('DELETE', f'/api/v1/api-keys/{name}')
        status, doc = api.call('POST', '/api/v1/api-keys', body)
    _expect(f'creating key {name}', status, doc, ok=(201,))
    return doc['secret']


def probe_max_id(api: Api, secret: str, default: int = 1_000_000) -> int:
    """The largest aid that answers, among the usual table sizes (1M for the demo, 10M for pgbench -s 100)."""
    best = 0
    for candidate in (1_000_000, 10_000_000):
        status, body = api.call('GET', f'/q/account?aid={candidate}', key=secret)
        if status == 200 and isinstance(body, list) and body:
            best = candidate
    return best or default


def provision(base_url: str, admin_key: str | None = None, *, connection: str = CONNECTION,
              write_connection: str = WRITE_CONNECTION) -> dict:
    """Everything the scenarios need; returns {'secrets', 'max_id', 'newest_version', 'writes', 'notes'}."""
    api = Api(base_url, admin_key or admin_key_from_env())
    status, body = api.call('GET', '/api/v1/queries')
    if status == 401:
        raise ProvisionError('the admin key was refused (401): check GATEWAY_ADMIN_KEY')
    _expect('listing queries', status, body)
    notes = [ensure_connection(api, connection)]
    if write_connection != connection:
        notes.append(ensure_connection(api, write_connection, writer=True))
    docs = {name: ensure_query(api, name, body) for name, body in queries(connection, write_connection).items()}
    secrets = {scenario: recreate_key(api, body) for scenario, body in keys(connection, write_connection).items()}
    max_id = int(os.environ.get('LOADTEST_MAX_ID') or probe_max_id(api, secrets['plain']))
    status, body = api.call('GET', '/q/account?aid=42', key=secrets['plain'])
    if status != 200:
        raise ProvisionError(f'the lookup does not answer: GET /q/account?aid=42 -> {status} {str(body)[:300]}')
    status, body = api.call('GET', '/q/deposit?aid=1&delta=1', key=secrets['writer'])
    if status == 200:
        writes = 'allowed'
    else:
        code = body.get('code') if isinstance(body, dict) else ''
        writes = (f'refused: {status} {code}' + (' - start the server with GATEWAY_ALLOW_WRITES=1'
                                                 if code == 'write_not_allowed' else ''))
    version = docs['account_versioned'].get('published_version') or 1
    notes.append(f'queries: {", ".join(docs)}; keys: {", ".join(b["name"] for b in keys().values())}; '
                 f'aid 1..{max_id:,}; account_versioned serves version {version}; writes {writes}')
    return {'secrets': secrets, 'max_id': max_id, 'newest_version': version, 'writes': writes, 'notes': notes}


def shell_lines(result: dict) -> str:
    lines = [f'KEY_{scenario.upper()}={secret}' for scenario, secret in result['secrets'].items()]
    lines += [f'MAX_ID={result["max_id"]}', f"WRITES='{result['writes']}'"]
    return '\n'.join(lines) + '\n'


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog='python -m loadtests.scenarios.provision', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--url', required=True, help='the gateway (or its load balancer), e.g. http://lb:8080')
    parser.add_argument('--admin-key', default=None, help='default: GATEWAY_ADMIN_KEY')
    parser.add_argument('--out', type=Path, default=None, help='write KEY_*=... lines here (mode 600)')
    args = parser.parse_args(argv)
    try:
        result = provision(args.url, args.admin_key)
    except ProvisionError as error:
        print(f'provisioning failed: {error}', file=sys.stderr)
        return 1
    for note in result['notes']:
        print(note)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, 'w') as fh:
            fh.write(shell_lines(result))
        print(f'secrets written to {args.out}')
    else:
        sys.stdout.write(shell_lines(result))
    return 0


if __name__ == '__main__':
    sys.exit(main())
