"""The limits block's pure pieces (loadtests/blocks/limits/): the exact limiters the accuracy phase compares with,
the comparison, the open-loop schedule, the pooled percentile, the skewed key draw of the wrk script (run for real
against a small server), and the report's verdicts on synthetic runs."""
from __future__ import annotations

import http.server
import shutil
import socketserver
import threading
from collections import Counter

import pytest

from loadtests import stats, wrk
from loadtests.blocks.limits import mixes, reference, render
from loadtests.blocks.limits.reference import Call

# --- the exact references --------------------------------------------------------------------

def test_token_bucket_admits_its_burst_then_its_rate():
    # 50 calls at once: the full bucket's 40, then nothing
    assert reference.token_bucket([0.0] * 50, rate=20, burst=40) == [True] * 40 + [False] * 10
    # after 0.5 s it holds 10 tokens again: 10 of 12 calls at 0.5 s
    assert sum(reference.token_bucket([0.0] * 40 + [0.5] * 12, 20, 40)[40:]) == 10
    # idle for a minute refills to the burst, never above it
    assert sum(reference.token_bucket([0.0] * 40 + [60.0] * 50, 20, 40)) == 80
    # 20/s exactly at the rate, starting full: every call admitted
    assert all(reference.token_bucket([i / 20 for i in range(200)], 20, 40))
    # 40/s for 10 s: burst + rate x T (the last arrival at 9.975 s: 40 + 199.5 whole tokens)
    assert sum(reference.token_bucket([i / 40 for i in range(400)], 20, 40)) == 239


def test_fixed_window_admits_the_first_limit_of_each_window():
    times = [10.0 + i / 100 for i in range(100)] + [11.0 + i / 100 for i in range(30)]
    admitted = reference.fixed_window(times, limit=20, unit_s=1.0)
    assert admitted[:20] == [True] * 20 and not any(admitted[20:100])
    assert admitted[100:120] == [True] * 20 and not any(admitted[120:])
    # its boundary lets 2 x limit through within a few milliseconds
    edge = [10.99] * 20 + [11.001] * 20
    assert sum(reference.fixed_window(edge, 20, 1.0)) == 40
    assert reference.most_in_window(edge, 1.0) == 40


def test_most_in_window_is_the_busiest_half_open_window():
    assert reference.most_in_window([], 1.0) == 0
    assert reference.most_in_window([0.0, 0.5, 0.99, 1.0, 1.5], 1.0) == 3   # [0, 1) and [0.5, 1.5)
    assert reference.most_in_window([0.0, 1.0, 2.0], 1.0) == 1


def test_compare_counts_over_admission_and_calls_refused_that_exact_admits():
    # key 1: 45 calls at once, all admitted: 5 over the exact bucket's 40
    calls = [Call(1, 0.0, 1000.0, 200) for _ in range(45)]
    # key 2: 10 calls spaced at the rate, 3 refused: exact admits all of them
    calls += [Call(2, i / 20, 1000 + i / 20, 429 if i in (2, 5, 7) else 200) for i in range(10)]
    # an error is no decision: left out of both sides
    calls.append(Call(2, 0.9, 1000.9, 503))
    result = reference.compare(calls, reference.bucket_rule(20, 40))
    assert result['admitted'] == 45 + 7 and result['exact'] == 40 + 10
    assert result['over'] == 5 and result['missed'] == 3 and result['extra'] == 5
    assert result['most_in_window'] == 45 and result['exact_most_in_window'] == 40
    # the same calls against a fixed window of 20 per wall second: key 1 over by 25
    windows = reference.compare(calls, reference.window_rule(20, 1.0))
    assert windows['exact'] == 20 + 10 and windows['over'] == 25


def test_poisson_schedule_offers_the_rate_per_key_and_is_repeatable():
    schedule = reference.poisson_schedule(keys=4, rate_per_key=200, duration_s=10, seed=7)
    assert schedule == sorted(schedule) and schedule == reference.poisson_schedule(4, 200, 10, 7)
    per_key = Counter(key for _, key in schedule)
    assert set(per_key) == {0, 1, 2, 3}
    assert all(1850 < n < 2150 for n in per_key.values()), per_key     # 2,000 +- 3.4 sigma
    assert all(0 <= t < 10 for t, _ in schedule)
    assert schedule != reference.poisson_schedule(4, 200, 10, 8)


def test_pooled_percentile_pools_every_call_of_every_round():
    fast = [[100, 995], [5000, 5]]          # this round alone: p99 100 us (wrk's rank: the 991st of 1,000)
    slow = [[200, 980], [5000, 20]]         # this one: p99 5 ms
    assert stats.pooled_percentile([fast], 99) == 100
    assert stats.pooled_percentile([slow], 99) == 5000
    assert stats.pooled_percentile([fast, slow], 99) == 5000    # 25 of 2,000 calls at 5 ms: rank 1,981 is one
    assert stats.pooled_percentile([fast, slow], 50) == 200     # rank 1,001: the first of the 200 us calls
    assert stats.pooled_percentile([fast, slow], 0) == 100
    assert stats.pooled_percentile([fast, slow], 100) == 5000
    assert stats.pooled_percentile([], 99) is None and stats.pooled_percentile([[]], 99) is None


# --- the mixes and the wrk script's draw -------------------------------------------------------

def test_mixes_give_each_product_its_limits():
    assert mixes.SKEWED.key_limits() == {'rate_limit': '20/second', 'rate_limit_burst': 40,
                                         'quota': {'calls': 100_000, 'per': 'day'}}
    assert mixes.SKEWED.key_limits('qag') == {'rate_limit': '20/second', 'quota': {'calls': 100_000, 'per': 'day'}}
    assert mixes.UNIFORM.key_limits() == {'rate_limit': '20/second'}
    assert mixes.SKEWED.hot() == 100 and mixes.SKEWED.hot(300) == 3 and mixes.UNIFORM.hot() == 0
    env = mixes.SKEWED.wrk_env('/k.txt')
    assert env == {'KEYS_FILE': '/k.txt', 'CLIENT_IPS': '10000', 'HOT_KEYS': '100', 'HOT_SHARE': '0.5'}
    assert 'HOT_KEYS' not in mixes.UNIFORM.wrk_env('/k.txt')
    assert [m.name for m in mixes.chosen('both')] == ['uniform', 'skewed']
    # fewer keys for one target: the hot set stays the mix's
    assert mixes.SKEWED.wrk_env('/q.txt', 2000, hot=100)['HOT_KEYS'] == '100'


def test_keys_per_target_cap_queryapigate_alone():
    from types import SimpleNamespace

    from loadtests.blocks.limits.run import keys_for
    full = SimpleNamespace(keys=None, qag_keys=2000)
    assert keys_for(mixes.SKEWED, full) == 10_000 and keys_for(mixes.SKEWED, full, 'limits-on') == 10_000
    assert keys_for(mixes.SKEWED, full, 'limits-qag') == 2000
    assert keys_for(mixes.UNIFORM, full, 'limits-qag') == 1000
    smoke = SimpleNamespace(keys=300, qag_keys=None)
    assert keys_for(mixes.SKEWED, smoke, 'limits-qag') == 300 and keys_for(mixes.UNIFORM, smoke) == 300


class CountingServer:
    """Answers every GET 200 and counts the X-API-Key and X-Forwarded-For it was sent."""

    def __init__(self):
        keys, ips, lock = Counter(), Counter(), threading.Lock()
        self.keys, self.ips = keys, ips

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = 'HTTP/1.1'
            disable_nagle_algorithm = True     # headers and body are two writes: no 40 ms delayed ACK between

            def do_GET(self):
                with lock:
                    keys[self.headers.get('X-API-Key')] += 1
                    ips[self.headers.get('X-Forwarded-For')] += 1
                self.send_response(200)
                self.send_header('Content-Length', '2')
                self.end_headers()
                self.wfile.write(b'{}')

            def log_message(self, *args):
                pass

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.server = Server(('127.0.0.1', 0), Handler)
        self.url = f'http://127.0.0.1:{self.server.server_address[1]}/'
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize('hot, share', [(10, 0.5), (0, None)])
def test_wrk_draws_the_hot_keys_with_their_share(tmp_path, hot, share):
    if not shutil.which('wrk'):
        pytest.skip('wrk is not installed')
    keys = [f'k{i:04d}' for i in range(1000)]
    (tmp_path / 'keys.txt').write_text('\n'.join(keys) + '\n')
    env = {'CHECK_BODY': 'off', 'KEYS_FILE': str(tmp_path / 'keys.txt'), 'CLIENT_IPS': '100',
           'LATENCY_HISTOGRAM': '1'}
    if hot:
        env.update(HOT_KEYS=str(hot), HOT_SHARE=str(share))
    server = CountingServer()
    try:
        result = wrk.run(server.url, connections=2, duration_s=2, env=env)
    finally:
        server.close()
    calls = sum(server.keys.values())
    assert calls > 1000, calls
    first_ten = sum(server.keys[k] for k in keys[:10]) / calls
    if hot:
        assert abs(first_ten - share) < 0.06, first_ten
        cold = [server.keys[k] for k in keys[10:]]
        assert max(cold) < 0.01 * calls, max(cold)       # the others share the rest evenly (~0.05% each)
    else:
        assert first_ten < 0.05, first_ten                # evenly: 1% expected
    assert len(server.ips) == 100 and all(ip.startswith('10.0.0.') for ip in server.ips)
    # the histogram wrk's percentiles come from (corrected by wrk for coordinated omission, stats_correct: a
    # call slower than the mean interval adds samples, so it holds at least every completed call)
    assert sum(count for _, count in result.latency_hist) >= result.requests
    for q in ('50', '99'):
        assert stats.pooled_percentile([result.latency_hist], float(q)) == result.latency_us[q]


# --- the report's verdicts -------------------------------------------------------------------

def cost_run(target, round_no, rps, cpu, reads, redis_us, connections=32, p99_hist=None):
    return {'block': 'limits', 'kind': 'run', 'mix': 'skewed', 'target': target, 'round': round_no, 'connections': connections,
            'rps': rps, 'requests': int(rps * 10), 'duration_s': 10, 'worker_cpu_us_per_call': cpu,
            'cpu_us_per_call': cpu, 'target_cores': 1.0, 'redis_per_call': reads * 3,
            'redis_scripts_per_call': reads, 'redis_reads_per_call': reads, 'redis_cpu_us_per_call': redis_us,
            'statuses': {'200': int(rps * 10), '429': 0}, 'errors': {}, 'ok': True, 'position': 0,
            'latency_us': {'50': 500, '90': 700, '99': 900, '99.9': 1000}, 'other_cores': 0.0,
            'latency_hist': p99_hist or [], 'started_at': '2026-12-01T00:00:00+00:00'}


def test_the_report_judges_the_goals_on_the_worst_round():
    runs = [cost_run('limits-off', 1, 1000, 200, 0.01, 1.0), cost_run('limits-off', 2, 1000, 200, 0.01, 1.0),
            cost_run('limits-on', 1, 950, 210, 0.03, 3.0), cost_run('limits-on', 2, 850, 230, 0.07, 7.0),
            cost_run('limits-off', 1, 500, 300, 0.01, 1.0, connections=1, p99_hist=[[400, 995], [900, 5]]),
            cost_run('limits-on', 1, 500, 300, 0.01, 1.0, connections=1, p99_hist=[[400, 980], [1300, 20]])]
    meta = {'block': 'limits', 'settings': {'mixes': ['skewed'], 'mix_text': {'skewed': 'the skewed mix'},
                                            'connections': [32, 1], 'duration_s': 10},
            'targets': [{'name': 'limits-on'}, {'name': 'limits-off'}]}
    text = render.render(meta, runs)
    # worker CPU 1.05x and 1.15x: the worst round misses 1.10x; throughput 0.95x and 0.85x: misses 0.90x
    assert 'worker CPU per call / limits-off: 1.10× [1.05×-1.15×], 2 round(s); worst round 1.15×: misses' in text
    assert 'req/s / limits-off: 0.90× [0.85×-0.95×], 2 round(s); worst round 0.85×: misses >= 0.90×' in text
    # round trips on minus off: +0.02 and +0.06 (worst misses 0.05); Redis CPU +2 and +6 µs (worst misses 5)
    assert '+0.0400 [+0.0200 to +0.0600]; worst +0.0600: misses <= 0.05' in text
    assert '+4.00 [+2.00 to +6.00]; worst +6.00: misses <= 5' in text
    # pooled p99: off 0.400 ms, on 1.300 ms (20 of 1,000 calls): +0.900 ms misses +0.3
    assert '| limits-on | 1,000 | 0.400 | 1.300 |' in text and '+0.900: misses <= +0.3' in text


def test_the_report_of_a_run_before_the_mixes_is_the_old_one():
    meta = {'block': 'limits', 'settings': {'keys': 1000, 'client_ips': 1000, 'ip_rate': '1000/minute',
                                            'connections': [32], 'duration_s': 10},
            'targets': [{'name': 'limits-on'}, {'name': 'limits-off'}]}
    runs = [dict(cost_run('limits-on', 1, 900, 210, 0.03, 3.0), mix=None),
            dict(cost_run('limits-off', 1, 1000, 200, 0.01, 1.0), mix=None)]
    text = render.render(meta, runs)
    assert '## Admission under realistic limits' in text and '## Mix' not in text
