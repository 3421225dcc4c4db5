"""The faults block (loadtests/blocks/faults/): its arithmetic on calls, its body check, its verdict on a run, and a
smoke run of the block itself - a real ``fleet up --instances 2`` with nginx, one worker SIGKILLed under the checked
load, the report written."""
from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from helpers.util import ROOT
from loadtests.blocks.faults import calls, load, render


def call(sent: float, ended: float, good: bool = True, status: int = 200) -> calls.Call:
    return calls.Call(sent, ended, status if good else 503, 'ok' if good else '-', '-' if good else 'x', 'r')


def test_recovery_is_the_first_clean_second_after_the_last_failure():
    t0 = 100.0
    ok_every_10ms = [call(t0 + i / 100 - 0.005, t0 + i / 100) for i in range(1, 600)]
    assert calls.recovery(ok_every_10ms, t0, t0 + 6) == 0.0
    # failures up to 2.5 s after the fault, one more at 3.2 s: the clean second after 2.5 s is cut short
    broken = [c for c in ok_every_10ms if not 1.0 <= c.ended - t0 <= 2.5 and abs(c.ended - t0 - 3.2) > 0.004]
    broken += [call(t0 + 1.0 + i / 50, t0 + 1.0 + i / 50 + 0.001, good=False) for i in range(76)]
    broken.append(call(t0 + 3.2, t0 + 3.2, good=False))
    # the first clean second is the one before the failures began: the block reports both
    assert calls.recovery(broken, t0, t0 + 6) == 0.0
    last_bad = max(c.ended for c in broken if not c.good)
    assert last_bad == pytest.approx(t0 + 3.2)
    assert calls.recovery(broken, last_bad, t0 + 6) == pytest.approx(0.0, abs=0.011)
    assert calls.failure_span(broken, t0, t0 + 6) == (pytest.approx(1.0, abs=0.01), pytest.approx(3.2, abs=0.01))
    # no answer at all for 1.5 s is not a recovered second either
    stalled = [c for c in ok_every_10ms if not 0.0 <= c.ended - t0 <= 1.5]
    assert calls.recovery(stalled, t0, t0 + 6) == pytest.approx(1.5, abs=0.011)
    # what the block reports: the first clean second after the last failure or stall
    assert calls.recovered_after(ok_every_10ms, t0, t0 + 6) == 0.0
    assert calls.recovered_after(broken, t0, t0 + 6) == pytest.approx(3.2, abs=0.011)
    assert calls.recovered_after(stalled, t0, t0 + 6) == pytest.approx(1.5, abs=0.011)
    # a stall after a clean start (a reload that holds every client) is not hidden by the clean start
    mid_stall = [c for c in ok_every_10ms if not 2.0 < c.ended - t0 < 3.5]
    assert calls.recovery(mid_stall, t0, t0 + 6) == 0.0
    assert calls.recovered_after(mid_stall, t0, t0 + 6) == pytest.approx(3.5, abs=0.011)
    # a stall still going on when the observation ends: not recovered
    assert calls.recovered_after([c for c in ok_every_10ms if c.ended - t0 < 4.5], t0, t0 + 6) is None
    # never clean within the observation
    assert calls.recovery([call(t0, t0 + i / 10, good=False) for i in range(1, 40)], t0, t0 + 4) is None


def test_seen_counts_every_outcome_and_the_longest_gap():
    t0 = 10.0
    got = [call(t0, t0 + 0.1), call(t0, t0 + 0.2, good=False), calls.Call(t0, t0 + 0.3, 0, '-', 'ConnectionRefusedError', '-'),
           calls.Call(t0, t0 + 0.9, 200, 'wrong', '-', 'r'), calls.Call(t0, t0 + 1.0, 500, '-', 'internal', 'r')]
    s = calls.seen(got, t0, t0 + 1.0)
    assert s['calls'] == 5 and s['good'] == 1
    assert s['non_2xx'] == {'503 x': 1, '500 internal': 1}
    assert s['connection_errors'] == {'ConnectionRefusedError': 1}
    assert s['wrong_bodies'] == 1 and s['status_500'] == 1
    assert s['longest_gap_ms'] == pytest.approx(600.0)
    assert s['latency_ms']['max'] == pytest.approx(1000.0)


def test_the_body_check_refuses_anything_but_the_row():
    expected = load.expected_bodies([[42, 1, 0]])[42]
    assert load.verdict(b'[{"aid":42,"bid":1,"abalance":0}]', expected) == 'ok'
    assert load.verdict(b'[ {"bid": 1, "aid": 42, "abalance": 0} ]', expected) == 'ok'   # same JSON, other bytes
    for wrong in (b'[{"aid":43,"bid":1,"abalance":0}]', b'[{"aid":42,"bid":1,"abalance":1}]', b'[]',
                  b'[{"aid":42,"bid":1,"abalance":0},{"aid":42,"bid":1,"abalance":0}]', b'<html>', b''):
        assert load.verdict(wrong, expected) == 'wrong', wrong


def test_a_run_with_a_wrong_body_or_a_500_is_marked_failed():
    record = {'fault': 'pg-restart', 'what': 'x', 'all': {'wrong_bodies': 0, 'status_500': 0}}
    assert render.failed([record]) == []
    assert render.failed([{**record, 'all': {'wrong_bodies': 1, 'status_500': 0}}])
    assert render.failed([{**record, 'all': {'wrong_bodies': 0, 'status_500': 2}}])


def free_base() -> int:
    """A base port whose block ports (base, +1, +10, +11, +12) are all free."""
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(('127.0.0.1', 0))
            base = sock.getsockname()[1]
        if base > 65000:
            continue
        try:
            for port in (base, base + 1, base + 10, base + 11, base + 12):
                with socket.socket() as probe:
                    probe.bind(('127.0.0.1', port))
        except OSError:
            continue
        return base
    raise RuntimeError('no free ports for the block')


@pytest.mark.slow
@pytest.mark.fleet     # `fleet up --instances 2` with nginx, through loadtests.bench
def test_the_block_runs_one_fault_and_reports_it(tmp_path):
    out = tmp_path / 'results'
    run = subprocess.run([sys.executable, '-m', 'loadtests.bench', 'faults', '--allow-dirty', '--faults', 'worker-kill',
                          '--clients', '4', '--quiet', '1.5', '--after', '1', '--max-observe', '10', '--settle', '0',
                          '--max-id', '1000', '--base-port', str(free_base()), '--out', str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (block,) = list(out.iterdir())
    (record,) = [json.loads(line) for line in (block / 'results.jsonl').read_text().splitlines()]
    every = record['all']
    assert record['fault'] == 'worker-kill' and every['calls'] > 100, record
    # the rule the block exists for, and the accounting that backs it
    assert every['wrong_bodies'] == 0 and every['status_500'] == 0, every
    assert every['calls'] == sum(every['outcomes'].values())
    assert record['facts']['replaced_after_s'] > 0
    assert record['baseline']['calls'] > 0 and record['window']['calls'] > 0
    assert record['history']['answered_2xx'] == every['outcomes'].get('200 ok', 0)
    assert record['history']['rows'] >= record['history']['answered_2xx'] - record['history']['lost_2xx']
    report = (block / 'results.md').read_text()
    assert '| worker-kill |' in report and 'Passed the hard rule' in report
