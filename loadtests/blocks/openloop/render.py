"""The openloop block's results.md: the oha block's tables and plot (loadtests/blocks/oha/render.py), then the
generator itself - its own lag, the send lag and its CPU - and the runs where it may have fallen behind."""
from __future__ import annotations

from pathlib import Path

from ... import rundir
from ..oha.render import plots, render


def write(run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    meta, records = rundir.load(run_dir)
    for r in records:
        r.setdefault('offered_pct', None)
        r.setdefault('latency_us', {})
        r.setdefault('problems', [])
    images = plots(meta, records, run_dir)
    text = render(meta['settings'], records, images, title='Python open-loop generator, wrk for capacity')
    suspect = [f'{r["scenario"]} at {r["offered_rps"]:,.0f} req/s: {"; ".join(r["suspect"])}'
               for r in records if r.get('suspect')]
    lag_lines = ['## The generator itself', '',
                 'Generator lag: scheduled time to the generator queueing the request (its own delay); send lag: '
                 'scheduled time to the request being written (it also waits for a free connection once the gateway '
                 'falls behind); generator cores: its own CPU. The latency above is measured from the scheduled time '
                 'either way.', '',
                 '| Scenario | Offered req/s | Generator lag p50 / p99 ms | Send lag p50 / p99 ms | Generator cores |',
                 '|---|---|---|---|---|']
    for r in records:
        if r['kind'] == 'open':
            lag, own = r.get('send_lag_us', {}), r.get('dispatch_lag_us', {})
            lag_lines.append(f'| {r["scenario"]} | {r["offered_rps"]:,.0f} | {own.get("50", 0) / 1000:.2f} / '
                             f'{own.get("99", 0) / 1000:.2f} | {lag.get("50", 0) / 1000:.2f} / '
                             f'{lag.get("99", 0) / 1000:.2f} | {r.get("generator_cores", 0):.2f} |')
    if suspect:
        lag_lines += ['', 'Suspect runs:', ''] + [f'- {s}' for s in suspect]
    path = run_dir / 'results.md'
    path.write_text(text + '\n'.join(lag_lines) + '\n')
    return path
