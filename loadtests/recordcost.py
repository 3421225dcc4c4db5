"""Hot-path cost of recording a run: ``HistoryWriter.record`` as a request thread calls it, per
call, in three variants interleaved round by round in one interpreter:

- ``before``: the writer of another commit (``--base``, default the one before the crash spool,
  read with ``git show``): one tuple appended to the queue;
- ``no spool``: this checkout with ``GATEWAY_HISTORY_SPOOL=off``: the COPY line is made on the
  request thread (the history thread no longer makes it) and queued with the run;
- ``spool``: this checkout with the spool in ``/dev/shm``: the same, plus one ``write(2)``.

    .venv/bin/python -m loadtests.recordcost [--rounds 7] [--calls 100000] [--threads 1]

No database: the writer's thread is not started, so nothing is drained; each round uses a fresh
writer. With ``--threads N`` the calls are made from N threads at once (the GIL serialises them;
this shows the writes do not contend on a lock of their own). Prints medians of per-round means
with their ranges, in microseconds per call.
"""
from __future__ import annotations

import argparse
import subprocess
import tempfile
import threading
import time
import types
from pathlib import Path

from gateway.store.history import HistoryWriter
from gateway.store.spool import Spool

from .stats import median_range, show_range
from .system import REPO

BASE = "3579e1f~1"   # the commit before the crash spool


def _before(commit: str) -> type:
    source = subprocess.run(["git", "show", f"{commit}:gateway/store/history.py"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout
    module = types.ModuleType("gateway.store._history_before")
    module.__package__ = "gateway.store"
    exec(compile(source, f"{commit}:gateway/store/history.py", "exec"), module.__dict__)
    return module.HistoryWriter


def _per_call_us(writer, calls: int, threads: int) -> float:
    each = calls // threads

    def run() -> None:
        record = writer.record
        for i in range(each):
            record(f"r-{i}", 7, "account", 3, 200, None, 1, 0.42, True)
    workers = [threading.Thread(target=run) for _ in range(threads)]
    started = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return (time.perf_counter() - started) / (each * threads) * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtests.recordcost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--base", default=BASE, help="the commit whose writer is 'before'")
    args = parser.parse_args(argv)
    before_cls = _before(args.base)
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    results: dict[str, list[float]] = {"before": [], "no spool": [], "spool": []}
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(dir=shm, prefix="recordcost-") as root:
            makers = {
                "before": lambda: before_cls(None, "bench:1", 500, 200, 10 ** 9),
                "no spool": lambda: HistoryWriter(None, "bench:1", 500, 200, 10 ** 9),  # type: ignore[arg-type]
                "spool": lambda: HistoryWriter(None, "bench:1", 500, 200, 10 ** 9,  # type: ignore[arg-type]
                                               spool=Spool(Path(root) / "spool", "bench:1")),
            }
            for name, make in makers.items():
                writer = make()
                results[name].append(_per_call_us(writer, args.calls, args.threads))
                spool = getattr(writer, "_spool", None)
                if spool is not None:
                    spool.close()
    print(f"HistoryWriter.record, {args.calls:,} calls x {args.rounds} rounds, {args.threads} thread(s); "
          f"µs per call, median [min-max]:")
    for name, values in results.items():
        print(f"  {name:9} {show_range(median_range(values), 2)}")


if __name__ == "__main__":
    main()
