"""Every knob of the gateway, in one struct, read in one place.

Settings are ``GATEWAY_*`` environment variables. ``Settings.from_env()`` is the only
reader; everything else receives a ``Settings`` instance (passed in, never read from
globals), so tests build one directly. ``python -m gateway.settings`` prints the
Markdown table that docs/settings.md carries (scripts/gen-docs).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from typing import Any

PREFIX = "GATEWAY_"
# How a boolean is written in text, everywhere: a setting, a query string's argument, a
# typed parameter (gateway.model.params). Here because settings import nothing of the gateway.
TRUE_WORDS = frozenset(("true", "1", "yes", "on"))
FALSE_WORDS = frozenset(("false", "0", "no", "off"))


def _doc(default: Any, help_text: str, env: str | None = None) -> Any:
    return field(default=default, metadata={"help": help_text, "env": env})


def tcp_migrate_req() -> bool:
    """Whether the kernel migrates the connections queued on a closing ``SO_REUSEPORT``
    socket to the other sockets of its group (Linux 5.14+, per network namespace)."""
    try:
        with open("/proc/sys/net/ipv4/tcp_migrate_req") as f:
            return f.read().strip() == "1"
    except OSError:
        return False


@dataclass(slots=True, frozen=True)
class Settings:
    # --- where things live -------------------------------------------------------------
    database_url: str = _doc("", "PostgreSQL URL of the gateway's own store. Empty: the "
                             "embedded default (a local PostgreSQL started by the project).")
    redis_url: str = _doc("", "Redis shared by the fleet. `redis://[:password@]host:port[/db]` (or "
                          "`rediss://`): one server; `redis+cluster://[:password@]host:port,host:port,...`: "
                          "Redis Cluster (the nodes are seeds); `redis+sentinel://[:password@]host:port,"
                          "host:port,.../<master>[/db][?sentinel_password=...]`: the master Sentinel "
                          "names `<master>`, followed through failovers. Empty: the embedded default "
                          "(a local Redis started by the project).")
    home: str = _doc(".fleet", "Folder for the embedded PostgreSQL/Redis data, logs and pid files.")
    pg_port: int = _doc(54329, "Port of the embedded PostgreSQL (loopback only).")
    redis_port: int = _doc(63799, "Port of the embedded Redis (loopback only).")

    # --- secrets -------------------------------------------------------------------------
    admin_key: str = _doc("", "Admin credential for `/api/v1` (sent as `X-API-Key`). The "
                          "embedded default generates one into `<home>/admin_key`.")
    secret_key: str = _doc("", "Key that encrypts connection passwords at rest (any string; "
                           "stretched to 256 bits). The embedded default generates one.")

    # --- serving -------------------------------------------------------------------------
    bind: str = _doc("127.0.0.1:8000", "Address gunicorn listens on (`--bind` on the command line wins).")
    workers: int = _doc(0, "Worker processes per gunicorn master. 0: one per usable core.")
    cpus: str = _doc("auto", "Cores to pin workers to: `auto` (the usable cores), a list "
                     "such as `0,2-3`, or `off` (no pinning).")
    worker_class: str = _doc("gthread", "gunicorn worker class: `gthread` (keep-alive, chosen by "
                             "measurement: docs/bench/), here gunicorn's gthread balanced across the "
                             "master's workers: a worker holding more connections than its least loaded "
                             "sibling stops accepting and moves the excess with `Connection: close`, and "
                             "restarts hand over without a failed call (fleet/server/worker.py); `sync` (no "
                             "keep-alive); or a gunicorn class path such as "
                             "`gunicorn.workers.gthread.ThreadWorker` (plain, unbalanced).")
    threads: int = _doc(8, "Threads per worker (gthread worker class).")
    keepalive: int = _doc(75, "Seconds an idle keep-alive connection is held (longer than a "
                          "load balancer's idle timeout).")
    reuse_port: str = _doc("off", "One listening socket per worker (`SO_REUSEPORT`): `on` lets the "
                           "kernel spread connections by a hash of their addresses (shares of 0.32-0.68 "
                           "measured); a worker that leaves (recycling, reload) accepts what is queued on its "
                           "own socket, then shuts it (no call failed through "
                           "either in tests/fleet/test_graceful.py; a connection arriving in the instant "
                           "between is still reset unless `net.ipv4.tcp_migrate_req=1` moves it to a sibling, "
                           "docs/bench/2026-11-30-balance.md); `auto`: on where that sysctl is 1; `off` "
                           "(default): one shared socket, balanced by the workers, no connection lost on a "
                           "restart.")
    max_requests: int = _doc(0, "Recycle a worker after this many requests (gunicorn `max_requests`, with "
                             "a jitter of a tenth); 0: never. A recycled worker finishes what it holds; "
                             "with the `gthread` class workers recycle one at a time, each while a sibling "
                             "serves (with a single worker, calls wait while its replacement boots).")
    max_body_bytes: int = _doc(1_048_576, "Largest request body accepted; larger answers 413.")
    # --- the front: what a connection may cost before its request is whole (fleet/server/front.py) ----
    head_timeout_s: float = _doc(10.0, "Seconds a request head may take to arrive, from its first byte (a new "
                                 "connection: from its accept); past it the connection is answered 408 "
                                 "`request_timeout` and closed. Absolute, so a byte every few seconds does not "
                                 "extend it. The head and body are read by the worker's loop: no thread waits "
                                 "for a slow client.")
    body_timeout_s: float = _doc(30.0, "Seconds a request body may take to arrive once its head has (1 MiB "
                                 "at about 35 KiB/s); past it, 408 `request_timeout` and the connection closed.")
    max_head_bytes: int = _doc(32_768, "Largest request head (request line and header fields); larger "
                               "answers 431 `headers_too_large`.")
    max_connections: int = _doc(16_384, "Connections a worker holds in all (idle kept-alive ones included). At "
                                "the cap a new connection is still accepted, and the connection whose request "
                                "has been arriving the longest (else the longest idle one) is closed to make "
                                "room: a flood of idle or slow connections cannot lock well-behaved clients "
                                "out. Each costs a file descriptor (the worker raises its soft limit to the "
                                "hard one) and a few KiB.")
    max_reading_per_client: int = _doc(64, "Connections one client address may have whose request is still "
                                       "arriving, per worker; a new one beyond it is closed at once. Peers "
                                       "trusted as proxies (`GATEWAY_FRONT_PROXIES`) are not capped: behind a "
                                       "load balancer every client has its address.")
    front_proxies: str = _doc("", "Comma-separated peer addresses exempt from `GATEWAY_MAX_READING_PER_CLIENT` "
                              "(a load balancer's, e.g. `10.0.0.5,10.0.0.6`); the cap in all still applies.")
    instance: str = _doc("", "Name of this gunicorn master inside the fleet (used for its "
                         "control socket and heartbeat files). Empty: derived from the bind port.")

    # --- data plane ----------------------------------------------------------------------
    default_page_size: int = _doc(10, "Rows per page when `page_size` is not given.")
    max_page_size: int = _doc(1000, "Largest `page_size` a caller may ask for.")
    statement_timeout_ms: int = _doc(30_000, "Statement timeout set once on every pooled "
                                     "data session; a caller's `timeout` can only lower it.")
    pool_size: int = _doc(0, "Pooled sessions per worker per connection. 0: `threads`.")
    connection_thread_share: float = _doc(0.75, "The bulkhead of a data connection: the share of a worker's "
                                          "`threads` that calls to one connection may hold at once while they "
                                          "run (rounded down, at least 1, at most `GATEWAY_POOL_SIZE`). The "
                                          "default leaves 2 of the default 8 threads to every other connection "
                                          "when one stops answering (a lock, a stalled server); a busy connection "
                                          "that answers still uses every thread, its calls past the share waiting "
                                          "for a place (see `GATEWAY_CONNECTION_STALL_MS`). 1: no bulkhead.")
    connection_stall_ms: int = _doc(500, "A call that finds its connection's share full waits for a place (never "
                                     "past its deadline) only while that connection's calls keep starting or "
                                     "finishing; when none has for this long, the connection counts as not "
                                     "answering and the call gets 503 `connection_busy` at once. Lower: a stalled "
                                     "connection costs the others' threads less time (its waiters hold them this "
                                     "long, once); higher: calls slower than this, more of them at once than the "
                                     "share, are queued rather than refused. The default is a hundred lookups' "
                                     "time.")
    stream_fetch_rows: int = _doc(2000, "Rows fetched per round trip when streaming from a "
                                  "server-side cursor (bounds memory).")
    csv_formula_guard: bool = _doc(True, "CSV and TSV answers prefix a text value that starts with `=`, `+`, `-`, "
                                   "`@`, a tab or a carriage return with `'` (OWASP's rule against CSV injection), so "
                                   "that a spreadsheet shows it instead of running it as a formula. Only values of "
                                   "text types are guarded: numbers, dates and other typed values never are. On by "
                                   "default because a CSV answer is typically opened in a spreadsheet by someone "
                                   "other than the author of the data, where a planted `=HYPERLINK(...)` or DDE "
                                   "formula runs; off only for consumers that need text cells byte for byte.")
    connect_timeout_s: int = _doc(3, "Timeout for opening a data or store session.")
    warm_calls: int = _doc(32, "A starting worker makes, before it serves, the plans of this many of the "
                           "(key, query) pairs the fleet called most in the last `GATEWAY_WARM_WINDOW_S` "
                           "(read from the run history), and reads their connections' schemas. 0: no warm-up.")
    warm_sessions: int = _doc(4, "Data sessions a starting worker opens before it serves, shared out over "
                              "the connections of those calls by their calls, each with their statements "
                              "prepared (never more than a pool holds). 0: none.")
    warm_window_s: int = _doc(10, "How far back the warm-up looks in the run history (its newest 5,000 runs "
                              "at most).")

    mask_key: str = _doc("", "Key of the `hash` mask (HMAC-SHA256), read once at start-up. Empty: "
                         "derived from `GATEWAY_SECRET_KEY`.")
    search_path: str = _doc("public", "The `search_path` pinned on every data session and used to "
                            "resolve table names when a query is analysed (comma-separated).")
    allow_functions: str = _doc("", "Function names lifted from the deny list of the analysis "
                                "(comma-separated, exact names, e.g. `pg_sleep`).")
    deny_functions: str = _doc("", "Function names added to the deny list of the analysis "
                               "(comma-separated; `name*` is a prefix).")
    allow_catalog_relations: str = _doc("", "Relations of `pg_catalog` and `information_schema`, and relations "
                                        "an extension owns (`public.pg_stat_statements`), that saved and ad-hoc "
                                        "queries may read (comma-separated, schema-qualified, e.g. "
                                        "`pg_catalog.pg_class`); every other one is refused for every key.")
    adhoc_cache: int = _doc(1000, "Distinct ad-hoc statements whose analysis each worker keeps.")
    allow_writes: bool = _doc(False, "Server ceiling for writes: saved queries that write run only "
                              "when this is on and the key has `allow_writes`.")

    # --- response cache ------------------------------------------------------------------
    cache_max_bytes: int = _doc(67_108_864, "Bytes of cached answers each worker holds (saved reads with a "
                                "`cache_ttl`); least recently used out first. 0: no per-worker cache. An "
                                "answer larger than a sixteenth of it is not cached.")
    cache_shared: str = _doc("off", "`on`: a shared tier in Redis behind each worker's cache, so a worker that "
                             "misses fills from another's answer instead of the database; `off`: per worker only.")
    cache_max_ttl: int = _doc(86_400, "Largest `cache_ttl` (seconds) a query or version may be saved with.")
    cache_write_wait_ms: int = _doc(100, "Longest a write through the gateway waits for every live worker to "
                                    "acknowledge that it dropped the cached answers of the tables it touched; "
                                    "past it the write answers, and a silent worker stops serving cached answers "
                                    "when its freshness lease runs out.")

    # --- run history ---------------------------------------------------------------------
    history_batch: int = _doc(500, "Runs written to the store per batch.")
    history_flush_ms: int = _doc(200, "Longest a run waits in memory before its batch is written.")
    history_queue_max: int = _doc(100_000, "Bound of the in-memory history queue; beyond it runs "
                                  "are dropped and counted.")
    history_retention_days: int = _doc(30, "Runs older than this are deleted (hourly, by one worker). "
                                       "0: keep everything.")
    history_spool: str = _doc("", "Folder of the workers' crash spools (each run recorded is also appended "
                              "to a file there until it is stored; a dead worker's spool is stored by another "
                              "worker of the same home on this host). Empty: `/dev/shm/gateway-fleet-<uid>-<hash "
                              "of GATEWAY_HOME>` (memory: survives a process, not the host), else "
                              "`<home>/run/spool`; `off`: no spool (a crash loses the runs of the last "
                              "`GATEWAY_HISTORY_FLUSH_MS`).")

    # --- fleet ---------------------------------------------------------------------------
    sync_timeout_ms: int = _doc(2000, "Longest a management call waits for every live worker "
                                "to acknowledge a change.")
    freshness_lease_ms: int = _doc(1500, "How long a worker trusts its catalog without hearing "
                                   "from the bus; past it, it reloads before serving.")
    bus_ping_ms: int = _doc(250, "Interval of the bus's keep-alive ping (renews the freshness lease).")

    # --- admission (rate limits and quotas) -------------------------------------------------
    admission: str = _doc("on", "`on`: rate limits and quotas are enforced across the fleet through "
                          "Redis leases; `off`: nothing is limited (for benchmarks and debugging).")
    rate_limit: str = _doc("", "Per client IP limit before authentication, `N/second|minute|hour|day`. "
                           "Empty: none.")
    rate_limit_burst: int = _doc(0, "Bucket size of `GATEWAY_RATE_LIMIT`. 0: the limit's N.")
    trust_proxy: int = _doc(0, "How many `X-Forwarded-For` hops to believe for the client IP "
                            "(1 behind one load balancer). 0: the socket's peer.")
    lease_ms: int = _doc(100, "How often a worker reports the calls it admitted on rate limits' local "
                         "headroom (one batched script), and the longest it spends a lease of tokens "
                         "before dropping what is left (the L of the documented bound).")
    lease_max: int = _doc(256, "Largest lease (tokens or calls) a worker takes in one Redis script "
                          "(never more than a quarter of what the bucket holds).")
    quota_hold_s: float = _doc(300.0, "Longest a worker holds calls leased from a key's quota before handing "
                               "back what is left: a key far below its quota costs one script per lease "
                               "however rarely it is called; leased calls are refused to other workers "
                               "for at most this long.")
    concurrency_lease_ms: int = _doc(10000, "A key's `max_concurrent` places live in Redis as leases "
                                     "renewed every third of this while their calls run: a worker killed "
                                     "holding places frees them within this long.")
    redis_timeout_ms: int = _doc(250, "Socket timeout of admission calls to Redis (past it, the call "
                                 "counts as Redis unreachable for 250 ms).")
    redis_failure: str = _doc("open", "With Redis unreachable: `open` admits through a local limiter "
                              "holding this worker's share of each rate limit; `closed` answers 503. "
                              "Quotas, either way: the calls a worker had leased, then 503.")
    degraded_log_s: int = _doc(60, "While Redis is unreachable each worker logs once when it starts deciding "
                               "locally, once when Redis answers again, and every this many seconds a "
                               "summary (calls admitted and refused locally).")

    log_level: str = _doc("info", "Log level (`debug`, `info`, `warning`, `error`).")
    access_log: bool = _doc(True, "JSON access log of data-plane calls, written by the history thread "
                            "(never by a request thread).")
    access_log_sample: float = _doc(1.0, "Share of calls written to the access log (0 to 1).")
    events: bool = _doc(True, "Live events (`GET /events`): runs and changes of the whole fleet "
                        "through a Redis stream (one command per history batch).")
    events_maxlen: int = _doc(2000, "Entries kept in the fleet's event stream (one per history batch or change; "
                              "`/events` resumes from `Last-Event-ID` within them).")
    events_max_streams: int = _doc(16, "Concurrent `/events` streams per worker (each holds a thread).")
    metrics_token: str = _doc("", "Bearer token of `GET /metrics` (Prometheus' `authorization` scrape setting "
                              "sends `Authorization: Bearer <token>`). Unset, `/metrics` answers 403 "
                              "`metrics_disabled` to everyone: its series name every query called. The "
                              "embedded default generates one into `<home>/metrics_token`.")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        environ = os.environ if environ is None else environ
        values = {}
        for f in fields(cls):
            raw = environ.get(PREFIX + f.name.upper())
            if raw is None or raw == "":
                continue
            values[f.name] = _coerce(f, raw)
        values.update(overrides)
        return cls(**values)

    def usable_cpus(self) -> list[int]:
        """The cores workers are pinned to, in order (empty when pinning is off)."""
        if self.cpus == "off":
            return []
        available = sorted(os.sched_getaffinity(0))
        if self.cpus in ("", "auto"):
            return available
        return parse_cpu_list(self.cpus)

    def __post_init__(self) -> None:
        if self.redis_failure not in ("open", "closed"):
            raise SystemExit("GATEWAY_REDIS_FAILURE must be 'open' or 'closed'")
        if self.admission not in ("on", "off"):
            raise SystemExit("GATEWAY_ADMISSION must be 'on' or 'off'")
        if self.redis_url and self.redis_url.split("://", 1)[0].lower() not in (
                "redis", "rediss", "unix", "redis+cluster", "redis+sentinel"):
            raise SystemExit("GATEWAY_REDIS_URL must start with redis://, rediss://, unix://, "
                             "redis+cluster:// or redis+sentinel://")
        if self.cache_shared not in ("on", "off"):
            raise SystemExit("GATEWAY_CACHE_SHARED must be 'on' or 'off'")
        if self.quota_hold_s <= 0:
            raise SystemExit("GATEWAY_QUOTA_HOLD_S must be above 0")
        if self.concurrency_lease_ms < 300:
            raise SystemExit("GATEWAY_CONCURRENCY_LEASE_MS must be at least 300 (renewed every third of it)")
        if min(self.warm_calls, self.warm_sessions, self.warm_window_s) < 0:
            raise SystemExit("GATEWAY_WARM_CALLS, GATEWAY_WARM_SESSIONS and GATEWAY_WARM_WINDOW_S must not be negative")
        if not 0 < self.connection_thread_share <= 1:
            raise SystemExit("GATEWAY_CONNECTION_THREAD_SHARE must be above 0 and at most 1")
        if self.connection_stall_ms < 0:
            raise SystemExit("GATEWAY_CONNECTION_STALL_MS must not be negative")
        if self.reuse_port not in ("auto", "on", "off"):
            raise SystemExit("GATEWAY_REUSE_PORT must be 'auto', 'on' or 'off'")
        for name in self.allowed_catalog_relations():
            if name.count(".") != 1 or not all(name.split(".")):
                raise SystemExit("GATEWAY_ALLOW_CATALOG_RELATIONS names relations schema-qualified "
                                 f"(pg_catalog.pg_class), got {name!r}")

    def reuse_port_enabled(self) -> bool:
        """Whether each worker gets its own listening socket (see ``reuse_port``)."""
        if self.reuse_port != "auto":
            return self.reuse_port == "on"
        return tcp_migrate_req()

    def worker_count(self) -> int:
        if self.workers > 0:
            return self.workers
        return max(1, len(self.usable_cpus()) or len(os.sched_getaffinity(0)))

    def search_path_tuple(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.search_path.split(",") if p.strip())

    def allowed_functions(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.allow_functions.split(",") if p.strip())

    def allowed_catalog_relations(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.allow_catalog_relations.split(",") if p.strip())

    def denied_functions(self) -> frozenset[str]:
        """The names added to the analysis's default deny list (``gateway.governance.policy``
        joins the two: settings import nothing of the gateway)."""
        return frozenset(p.strip() for p in self.deny_functions.split(",") if p.strip())

    def mask_key_bytes(self) -> bytes:
        import hashlib
        return (self.mask_key or hashlib.sha256(b"mask:" + self.secret_key.encode()).hexdigest()).encode()

    def effective_pool_size(self) -> int:
        return self.pool_size or self.threads

    def connection_places(self) -> int:
        """The calls one connection may run at once in a worker (its bulkhead): a share of the
        threads, never more than its pool holds sessions (so a call never waits for a session
        after it got its place)."""
        share = int(self.connection_thread_share * self.threads + 1e-9)   # 0.29 * 100 is 28.999...
        return max(1, min(share, self.effective_pool_size()))


def parse_cpu_list(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.extend(range(int(lo), int(hi) + 1))
        else:
            cpus.append(int(part))
    return cpus


def _coerce(f: Field[Any], raw: str) -> Any:
    default = f.default
    try:
        if isinstance(default, bool):
            return raw.strip().lower() in TRUE_WORDS
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
    except ValueError:
        raise SystemExit(f"{PREFIX}{f.name.upper()} must be a number, got {raw!r}") from None
    return raw


def markdown_table() -> str:
    rows = ["| Variable | Default | Meaning |", "| --- | --- | --- |"]
    for f in fields(Settings):
        default = f.default if f.default != "" else "(empty)"
        rows.append(f"| `{PREFIX}{f.name.upper()}` | `{default}` | {f.metadata['help']} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
