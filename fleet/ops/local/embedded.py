"""The embedded default: a local PostgreSQL and a local Redis living under ``settings.home``.

When ``GATEWAY_DATABASE_URL`` / ``GATEWAY_REDIS_URL`` are empty the project starts its own
servers, bound to 127.0.0.1 only, with generated passwords kept in ``<home>`` (mode 0600):

    <home>/pg/             PostgreSQL data directory (initdb on first start)
    <home>/pg.log          PostgreSQL server log
    <home>/pgrun/          PostgreSQL unix socket directory
    <home>/pg_password     superuser ("postgres") password
    <home>/pg_demo_password   password of ``demo_reader``, the demo connection's read-only role
    <home>/pg_demo_writer_password   password of ``demo_writer``, the demo_writer connection's
                           role: it may only run the load tests' deposit UPDATE
    <home>/redis.conf      generated Redis config (holds the password, so 0600)
    <home>/redis.pid, redis.log, redis_password
    <home>/admin_key, secret_key, metrics_token   generated once when not configured
    <home>/.lock           flock taken while starting servers or generating secrets

Running as root: ``initdb``/``pg_ctl`` refuse root, so they run as the ``postgres`` system
user (``runuser``), and the PostgreSQL paths above are chowned to it. The data stays under
``<home>`` (removing the folder removes everything). For that user to reach it, every
parent of ``<home>`` that it cannot traverse gets the *search* bit for others (``o+x``: it
lets a process pass through the folder, not list it), and a line saying so is printed.
That is the case for pytest's ``/tmp/pytest-of-root`` (0700) or a home under ``/root``.
Not root: every binary runs directly as the current user and nothing is chmodded.
"""
from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import pwd
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import psycopg2
import psycopg2.errors
import redis
from psycopg2 import sql

if TYPE_CHECKING:
    from gateway.settings import Settings

__all__ = [
    "LocalPostgres", "LocalRedis", "ensure_embedded", "stop_embedded", "demo_database_url",
    "demo_reader_password", "demo_writer_password",
]

_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes; PostgreSQL adds "/.s.PGSQL.<port>"
_ACL_LOCK_KEY = 0x6677_0003  # pg_advisory_xact_lock key for "changing a database's ACL" (demo.py: 0x6677_0001-2)


def _log(message: str) -> None:
    print(f"[fleet.ops.local] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _home_lock(home: Path) -> Iterator[None]:
    """Exclusive flock on ``<home>/.lock`` (not re-entrant: never nest it)."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _secret_file(path: Path, nbytes: int = 32) -> str:
    """Read a generated secret, creating it (mode 0600) on first use. Call under the lock."""
    try:
        value = path.read_text().strip()
        if value:
            return value
    except FileNotFoundError:
        pass
    value = secrets.token_urlsafe(nbytes)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(value + "\n")
    os.chmod(path, 0o600)
    return value


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(path, 0o600)


class LocalPostgres:
    """A PostgreSQL cluster in ``<home>/pg`` listening on 127.0.0.1:``port``."""

    SUPERUSER = "postgres"

    def __init__(self, home: Path | str, port: int) -> None:
        self.home = Path(home).absolute()
        self.port = int(port)
        self.data_dir = self.home / "pg"
        self.log_file = self.home / "pg.log"
        self.socket_dir = self.home / "pgrun"
        self.password_file = self.home / "pg_password"
        self._bindir: Path | None = None

    # --- public ------------------------------------------------------------------------
    def start(self) -> None:
        """Initialise on first use, then start; does nothing when already running."""
        with _home_lock(self.home):
            if self.is_running():
                return
            self._prepare_paths()
            if not (self.data_dir / "PG_VERSION").exists():
                self._initdb()
            self._write_conf()
            _log(f"starting PostgreSQL on 127.0.0.1:{self.port} (data {self.data_dir})")
            self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data_dir),
                      "-l", str(self.log_file))

    def stop(self) -> None:
        """Fast shutdown (what ``pg_ctl stop -m fast`` does: SIGINT, wait for the pid file)."""
        pid = self._pid()
        if pid is None:
            return
        _log(f"stopping PostgreSQL in {self.data_dir}")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)
        if not _wait_gone(pid, 60):
            raise RuntimeError(f"PostgreSQL (pid {pid}) did not stop; see {self.log_file}")

    def is_running(self) -> bool:
        return self._pid() is not None

    def password(self) -> str:
        return self.password_file.read_text().strip()

    def url(self, dbname: str = "postgres") -> str:
        return (f"postgresql://{self.SUPERUSER}:{quote(self.password(), safe='')}"
                f"@127.0.0.1:{self.port}/{quote(dbname, safe='')}")

    def ensure_database(self, name: str) -> None:
        """Create database ``name`` unless it exists (safe to race with another process)."""
        conn = psycopg2.connect(self.url("postgres"), connect_timeout=10)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                for attempt in range(20):
                    cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                    if cur.fetchone():
                        return
                    try:
                        cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                        return
                    except (psycopg2.errors.DuplicateDatabase, psycopg2.errors.UniqueViolation):
                        return  # created meanwhile by a concurrent caller
                    except psycopg2.errors.ObjectInUse:  # template1 busy: another CREATE DATABASE
                        time.sleep(0.1 * (attempt + 1))
                raise RuntimeError(f"could not create database {name!r}")
        finally:
            conn.close()

    def close_to_public(self, *names: str) -> None:
        """Take back what every role (PUBLIC) gets on a new database: CONNECT and TEMPORARY.
        Only the superuser uses the store and the maintenance database here; the demo roles
        log in to ``demo`` alone, and must not open a session (or make tables, temporary
        ones included) anywhere else."""
        conn = psycopg2.connect(self.url("postgres"), connect_timeout=10)
        try:
            # One caller at a time: two REVOKEs of one database's ACL at once fail one of them
            # ("tuple concurrently updated"), e.g. two masters starting on one empty home.
            with conn, conn.cursor() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (_ACL_LOCK_KEY,))
                for name in names:
                    cur.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(name)))
        finally:
            conn.close()

    # --- internals ---------------------------------------------------------------------
    def _pid(self) -> int | None:
        """The postmaster's pid from ``postmaster.pid`` when that process is alive and is
        ours (a postmaster runs in its data directory; a reused pid does not)."""
        pid = _live_pid(self.data_dir / "postmaster.pid", "postgres")
        try:
            if pid and Path(f"/proc/{pid}/cwd").resolve() != self.data_dir.resolve():
                return None
        except OSError:
            pass  # cannot look (another user's process): trust the pid file
        return pid

    @property
    def bindir(self) -> Path:
        if self._bindir is None:
            self._bindir = find_pg_bindir()
        return self._bindir

    def _as_postgres(self) -> bool:
        return os.geteuid() == 0

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(self.bindir / tool), *args]
        if self._as_postgres():
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        result = subprocess.run(cmd, capture_output=True, text=True, cwd="/",
                                stdin=subprocess.DEVNULL)
        if check and result.returncode != 0:
            tail = ""
            if self.log_file.exists():
                tail = "\n".join(self.log_file.read_text(errors="replace").splitlines()[-15:])
            raise RuntimeError(f"{tool} {' '.join(args)} failed ({result.returncode}):\n"
                               f"{result.stdout}{result.stderr}\n{tail}")
        return result

    def _prepare_paths(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        _secret_file(self.password_file, 24)
        for folder in (self.data_dir, self.socket_dir):
            folder.mkdir(mode=0o700, exist_ok=True)
            os.chmod(folder, 0o700)
        self.log_file.touch(mode=0o600, exist_ok=True)
        if self._as_postgres():
            pg = pwd.getpwnam("postgres")
            for path in (self.data_dir, self.socket_dir, self.log_file):
                os.chown(path, pg.pw_uid, pg.pw_gid)
            _grant_traversal(self.home, pg.pw_uid)

    def _initdb(self) -> None:
        _log(f"initdb {self.data_dir}")
        pwfile = self.socket_dir / "initdb.pw"  # readable by the server user, removed at once
        _write_private(pwfile, self.password() + "\n")
        if self._as_postgres():
            pg = pwd.getpwnam("postgres")
            os.chown(pwfile, pg.pw_uid, pg.pw_gid)
        try:
            self._run("initdb", "-D", str(self.data_dir), "-U", self.SUPERUSER,
                      f"--pwfile={pwfile}", "--auth-host=scram-sha-256",
                      "--auth-local=scram-sha-256", "--encoding=UTF8", "--locale=C.UTF-8")
        finally:
            pwfile.unlink(missing_ok=True)
        with open(self.data_dir / "postgresql.conf", "a") as conf:
            conf.write("\n# gateway-fleet: settings rewritten on every start\n"
                       "include_if_exists = 'gateway.conf'\n")

    def _write_conf(self) -> None:
        socket_dir = str(self.socket_dir)
        if len(socket_dir) + 20 > _SOCKET_PATH_MAX:
            _log(f"socket path under {socket_dir} too long: unix socket disabled (TCP only)")
            socket_dir = ""
        lines = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": _pg_quote(socket_dir),
            "max_connections": "300",
            "shared_buffers": "'256MB'",
            "fsync": "on",
        }
        if (pg_pkglibdir(self.bindir) / "pg_stat_statements.so").exists():
            lines["shared_preload_libraries"] = "'pg_stat_statements'"
        conf = self.data_dir / "gateway.conf"
        conf.write_text("".join(f"{k} = {v}\n" for k, v in lines.items()))
        if self._as_postgres():
            pg = pwd.getpwnam("postgres")
            os.chown(conf, pg.pw_uid, pg.pw_gid)


class LocalRedis:
    """A daemonized redis-server (or valkey-server) on 127.0.0.1:``port``, no persistence."""

    def __init__(self, home: Path | str, port: int) -> None:
        self.home = Path(home).absolute()
        self.port = int(port)
        self.conf_file = self.home / "redis.conf"
        self.pid_file = self.home / "redis.pid"
        self.log_file = self.home / "redis.log"
        self.password_file = self.home / "redis_password"

    def start(self) -> None:
        """Start the server; does nothing when it already answers."""
        with _home_lock(self.home):
            if self.is_running():
                return
            password = _secret_file(self.password_file, 24)
            binary = find_redis_server()
            _write_private(self.conf_file, "".join(f"{line}\n" for line in [
                "bind 127.0.0.1",
                f"port {self.port}",
                "protected-mode yes",
                "daemonize yes",
                f'pidfile "{self.pid_file}"',
                f'logfile "{self.log_file}"',
                f'dir "{self.home}"',
                'save ""',
                "appendonly no",
                f"requirepass {password}",
            ]))
            _log(f"starting {Path(binary).name} on 127.0.0.1:{self.port}")
            subprocess.run([binary, str(self.conf_file)], check=True, cwd=self.home,
                           stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while not self.is_running():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis did not come up on port {self.port}; "
                                       f"see {self.log_file}")
                time.sleep(0.05)

    def stop(self) -> None:
        pid = self._pid()
        if pid is None:
            return
        _log(f"stopping redis (pid {pid})")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not _wait_gone(pid, 10):
            raise RuntimeError(f"redis (pid {pid}) did not stop; see {self.log_file}")
        self.pid_file.unlink(missing_ok=True)

    def is_running(self) -> bool:
        """True when our server answers PING with our password."""
        if not self.password_file.exists():
            return False
        client = redis.Redis.from_url(self.url(), socket_timeout=1, socket_connect_timeout=1)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def password(self) -> str:
        return self.password_file.read_text().strip()

    def url(self) -> str:
        return f"redis://:{quote(self.password(), safe='')}@127.0.0.1:{self.port}/0"

    def _pid(self) -> int | None:
        return _live_pid(self.pid_file, "redis", "valkey")


# --- the embedded default, as the gateway uses it -------------------------------------------
def _home(settings: Settings) -> Path:
    return Path(settings.home).absolute()


def ensure_embedded(settings: Settings) -> dict[str, str]:
    """Start what ``settings`` leaves to the embedded default; return the env vars to set."""
    home = _home(settings)
    env: dict[str, str] = {}
    if not settings.database_url:
        pg = LocalPostgres(home, settings.pg_port)
        pg.start()
        pg.ensure_database("gateway")
        pg.close_to_public("gateway", "postgres")
        env["GATEWAY_DATABASE_URL"] = pg.url("gateway")
    if not settings.redis_url:
        rd = LocalRedis(home, settings.redis_port)
        rd.start()
        env["GATEWAY_REDIS_URL"] = rd.url()
    if not settings.admin_key or not settings.secret_key or not settings.metrics_token:
        with _home_lock(home):
            if not settings.admin_key:
                env["GATEWAY_ADMIN_KEY"] = _secret_file(home / "admin_key")
            if not settings.secret_key:
                env["GATEWAY_SECRET_KEY"] = _secret_file(home / "secret_key")
            if not settings.metrics_token:   # /metrics is off without one (gateway/http/metrics.py)
                env["GATEWAY_METRICS_TOKEN"] = _secret_file(home / "metrics_token")
    return env


def demo_database_url(settings: Settings) -> str:
    """Start the local PostgreSQL if needed, ensure its ``demo`` database, return its URL."""
    pg = LocalPostgres(_home(settings), settings.pg_port)
    pg.start()
    pg.ensure_database("demo")
    return pg.url("demo")


def demo_reader_password(settings: Settings) -> tuple[str, bool]:
    """The demo role's password, generated on first use like the others; and whether it was
    generated now (a demo connection saved before then holds another one)."""
    return _demo_password(settings, "pg_demo_password")


def demo_writer_password(settings: Settings) -> tuple[str, bool]:
    """The same for ``demo_writer``, the role of the demo_writer connection."""
    return _demo_password(settings, "pg_demo_writer_password")


def _demo_password(settings: Settings, name: str) -> tuple[str, bool]:
    home = _home(settings)
    path = home / name
    with _home_lock(home):
        before = path.read_text().strip() if path.exists() else ""
        password = _secret_file(path, 24)
        return password, password != before


def stop_embedded(settings: Settings) -> None:
    """Stop the local servers under ``settings.home`` (those not running are skipped)."""
    home = _home(settings)
    LocalRedis(home, settings.redis_port).stop()
    LocalPostgres(home, settings.pg_port).stop()


# --- finding binaries -----------------------------------------------------------------------
def find_pg_bindir() -> Path:
    """PostgreSQL server binaries: ``pg_config --bindir``, else the newest
    ``/usr/lib/postgresql/*/bin``, else ``initdb`` on PATH."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        if out.returncode == 0:
            candidates.append(Path(out.stdout.strip()))

    def version(path: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", Path(path).parent.name))

    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                                           key=version, reverse=True)]
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).parent)
    for bindir in candidates:
        if (bindir / "initdb").exists() and (bindir / "pg_ctl").exists():
            return bindir
    raise RuntimeError("no PostgreSQL server binaries found (initdb, pg_ctl); "
                       "run scripts/bootstrap or set GATEWAY_DATABASE_URL")


def pg_pkglibdir(bindir: Path) -> Path:
    pg_config = bindir / "pg_config"
    if pg_config.exists():
        out = subprocess.run([str(pg_config), "--pkglibdir"], capture_output=True, text=True)
        if out.returncode == 0:
            return Path(out.stdout.strip())
    return bindir.parent / "lib"


def find_redis_server() -> str:
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/bin")
        if found:
            return found
    raise RuntimeError("neither redis-server nor valkey-server found; "
                       "run scripts/bootstrap or set GATEWAY_REDIS_URL")


# --- small helpers --------------------------------------------------------------------------
def _pg_quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _live_pid(pid_file: Path, *names: str) -> int | None:
    """The pid on the first line of ``pid_file`` if that process is alive and its command
    line mentions one of ``names`` (a stale file whose pid was reused does not count)."""
    try:
        pid = int(pid_file.read_text().split("\n", 1)[0].strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (OSError, ValueError):
        return None
    return pid if _running(pid) and any(name in cmdline for name in names) else None


def _running(pid: int) -> bool:
    """Alive and not a zombie (a daemon's exit is final before its reaper collects it)."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat_line.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _grant_traversal(path: Path, uid: int) -> None:
    """Give others the search bit (o+x) on each folder from / to ``path`` that ``uid``
    (not its owner) could not otherwise pass through."""
    for folder in [*reversed(path.parents), path]:
        st = folder.stat()
        if st.st_uid == uid or st.st_mode & stat.S_IXOTH:
            continue
        _log(f"chmod o+x {folder} (so the postgres user can reach {path})")
        os.chmod(folder, stat.S_IMODE(st.st_mode) | stat.S_IXOTH)
