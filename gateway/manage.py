"""The control plane: validated changes to connections, saved queries and API keys.

Every change runs in one store transaction that also bumps the catalog generation; after
the commit the fleet is told (``Sync.announce``) and the call returns only once no
worker serves the old state. Shapes follow QueryAPIGate's Management API.
"""
from __future__ import annotations

import contextvars
import re
from contextlib import contextmanager
from datetime import date, datetime, timezone

import psycopg2
import psycopg2.errors
import psycopg2.extras
import psycopg2.pool

from . import crypto
from .errors import GatewayError, bad_request, conflict, not_found, unavailable
from .catalog import Connection
from .governance import Grants, analyze, compile_masks
from .limits import Quota, Rate
from .params import compile_specs
from . import sql as sqlreader

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
CONNECTION_FIELDS = {"name", "db", "host", "port", "database", "user", "password", "active", "options"}
QUERY_FIELDS = {"name", "connection_name", "sql", "parameters", "publish", "description", "tags",
                "max_affected_rows", "mask"}
KEY_FIELDS = {"name", "queries", "connections", "expires_at", "active", "rate_limit", "rate_limit_burst",
              "quota", "allow_writes", "allowed_tables", "mask", "allowed_write_ops", "max_rows", "query_timeout",
              "allowed_ips"}
GOVERNANCE_FIELDS = ("allowed_tables", "mask", "allowed_write_ops", "max_rows", "query_timeout", "allowed_ips")


class Actor:
    """Who is making a management change (set per request by the management resources)."""

    __slots__ = ("name", "ip", "request_id")

    def __init__(self, name: str = "system", ip: str | None = None, request_id: str | None = None):
        self.name = name
        self.ip = ip
        self.request_id = request_id


ACTOR: contextvars.ContextVar[Actor] = contextvars.ContextVar("gateway_actor", default=Actor())

_SNAPSHOTS = {
    "connection": "SELECT to_jsonb(c) - 'password' || jsonb_build_object('password_set', c.password IS NOT NULL) "
                  "FROM gw_connections c WHERE c.name = %s",
    "query": "SELECT to_jsonb(q) || jsonb_build_object('versions', (SELECT jsonb_agg(jsonb_build_object("
             "'version', v.version, 'sql', v.sql, 'parameters', v.parameters, 'published_at', v.published_at) "
             "ORDER BY v.version) FROM gw_query_versions v WHERE v.query_id = q.id)) FROM gw_queries q WHERE q.name = %s",
    "key": "SELECT to_jsonb(k) - 'secret_hash' FROM gw_api_keys k WHERE k.name = %s",
}


def _snapshot(cur, kind: str, name: str):
    """The object as the audit log shows it: secrets never included."""
    cur.execute(_SNAPSHOTS[kind], (name,))
    row = cur.fetchone()
    return None if row is None else next(iter(row.values()))


def _filters(args: dict, allowed: dict[str, str]) -> tuple[str, list]:
    unknown = set(args) - set(allowed) - {"limit"}
    if unknown:
        raise bad_request("invalid_filter", f"unknown filter(s): {', '.join(sorted(unknown))}")
    clauses, values = [], []
    for name, clause in allowed.items():
        if name in args:
            value = args[name]
            if isinstance(value, list):
                raise bad_request("invalid_filter", f"{name} was given more than once")
            if name in ("since", "until"):
                try:
                    value = datetime.fromisoformat(value)
                except ValueError:
                    raise bad_request("invalid_filter", f"{name} must be an ISO 8601 datetime") from None
            if name == "status" and not value.isdigit():
                raise bad_request("invalid_filter", "status must be an HTTP status code")
            clauses.append(clause)
            values.append(value)
    return ("WHERE " + " AND ".join(clauses)) if clauses else "", values


def _limit(args: dict) -> int:
    raw = args.get("limit", "100")
    if not isinstance(raw, str) or not raw.isdigit() or not 1 <= int(raw) <= 10_000:
        raise bad_request("invalid_filter", "limit must be an integer from 1 to 10000")
    return int(raw)


def _iso(value):
    return value.isoformat() if value is not None else None


def _require_fields(body: dict, allowed: set[str]) -> None:
    unknown = set(body) - allowed
    if unknown:
        raise bad_request("invalid_body", f"unknown field(s): {', '.join(sorted(unknown))}",
                          errors={k: "is not a known field" for k in sorted(unknown)})


def _name(body: dict, what: str) -> str:
    name = body.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise bad_request("invalid_body", f"{what} name must be 1-64 letters, digits, '_', '-' or '.'",
                          errors={"name": "is missing or not a valid name"})
    return name


def _str_list(body: dict, field: str) -> list[str]:
    value = body.get(field)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad_request("invalid_body", f"{field} must be a list of strings", errors={field: "must be a list of strings"})
    return sorted(set(value))


def _expires(body: dict):
    raw = body.get("expires_at")
    if raw is None:
        return None
    try:
        if isinstance(raw, str) and len(raw) == 10:
            return datetime.combine(date.fromisoformat(raw), datetime.min.time(), timezone.utc)
        value = datetime.fromisoformat(raw)
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    except (TypeError, ValueError):
        raise bad_request("invalid_body", "expires_at must be an ISO 8601 date or datetime",
                          errors={"expires_at": "must be an ISO 8601 date or datetime"}) from None


class Management:
    def __init__(self, settings, sync, password_box: crypto.PasswordBox, store_pool, schemas=None):
        self._schemas = schemas
        self._settings = settings
        self._sync = sync
        self._box = password_box
        self._pool = store_pool
        self.last_sync: dict = {}
        self.on_change = None    # live events: called with each committed change

    # --- plumbing ----------------------------------------------------------------------
    @contextmanager
    def _cursor(self):
        try:
            conn = self._pool.getconn()
        except (psycopg2.Error, psycopg2.pool.PoolError):
            raise unavailable("store_unavailable", "the gateway's store cannot be reached") from None
        broken = False
        try:
            with conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
                yield cur
            conn.commit()
        except psycopg2.OperationalError:
            broken = True
            raise unavailable("store_unavailable", "the gateway's store cannot be reached") from None
        except BaseException:
            if not conn.closed:
                conn.rollback()
            raise
        finally:
            self._pool.putconn(conn, close=broken or bool(conn.closed))

    @contextmanager
    def _change(self, action: str, kind: str, name: str):
        """A write transaction that bumps the generation and records the audit entry (who,
        what, before, after) in the same commit; announces to the fleet after it."""
        with self._cursor() as cur:
            before = _snapshot(cur, kind, name)
            yield cur
            after = _snapshot(cur, kind, name)
            cur.execute("UPDATE gw_catalog_state SET generation = generation + 1 RETURNING generation")
            generation = cur.fetchone()["generation"]
            who = ACTOR.get()
            cur.execute("INSERT INTO gw_audit (actor, client_ip, request_id, action, kind, name, before, after, "
                        "generation) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                        (who.name, who.ip, who.request_id, action, kind, name,
                         psycopg2.extras.Json(before), psycopg2.extras.Json(after), generation))
        self.last_sync = self._sync.announce(generation)
        if self.on_change is not None:
            self.on_change({"action": action, "kind": kind, "name": name, "generation": generation,
                            "actor": who.name, "request_id": who.request_id})

    # --- connections -------------------------------------------------------------------
    def _connection_values(self, body: dict, partial: bool) -> dict:
        _require_fields(body, CONNECTION_FIELDS)
        values, errors = {}, {}
        if "db" in body:
            if body["db"] not in ("postgres", "postgresql"):
                errors["db"] = "only 'postgres' is supported"
            values["db"] = "postgres"
        for field, column in (("host", "host"), ("database", "database"), ("user", "username")):
            if field in body:
                if not isinstance(body[field], str) or not body[field]:
                    errors[field] = "must be a non-empty string"
                values[column] = body[field]
            elif not partial:
                errors[field] = "is required"
        if "port" in body:
            port = body["port"]
            if isinstance(port, str) and port.isdigit():
                port = int(port)
            if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
                errors["port"] = "must be an integer from 1 to 65535"
            values["port"] = port
        if "password" in body:
            if body["password"] is not None and not isinstance(body["password"], str):
                errors["password"] = "must be a string"
            else:
                values["password"] = self._box.seal(body["password"])
        if "active" in body:
            if not isinstance(body["active"], bool):
                errors["active"] = "must be true or false"
            values["active"] = body["active"]
        if "options" in body:
            if not isinstance(body["options"], dict):
                errors["options"] = "must be an object"
            values["options"] = psycopg2.extras.Json(body["options"])
        if errors:
            raise bad_request("invalid_body", "invalid connection", errors=errors)
        return values

    def create_connection(self, body: dict) -> dict:
        name = _name(body, "connection")
        values = self._connection_values(body, partial=False)
        values["name"] = name
        cols = ", ".join(values)
        try:
            with self._change("create", "connection", name) as cur:
                cur.execute(f"INSERT INTO gw_connections ({cols}) VALUES ({', '.join(['%s'] * len(values))})",
                            list(values.values()))
        except psycopg2.errors.UniqueViolation:
            raise conflict("connection_exists", f"connection '{name}' already exists") from None
        return self.get_connection(name)

    def update_connection(self, name: str, body: dict) -> dict:
        body = {k: v for k, v in body.items() if k != "name"} if body.get("name") in (None, name) else body
        values = self._connection_values(body, partial=True)
        if "name" in body:
            raise bad_request("invalid_body", "a connection cannot be renamed", errors={"name": "cannot change"})
        if not values:
            return self.get_connection(name)
        sets = ", ".join(f"{c} = %s" for c in values)
        with self._change("update", "connection", name) as cur:
            cur.execute(f"UPDATE gw_connections SET {sets}, updated_at = now() WHERE name = %s",
                        [*values.values(), name])
            if cur.rowcount == 0:
                raise not_found("connection_not_found", f"connection '{name}' not found")
        return self.get_connection(name)

    def delete_connection(self, name: str) -> None:
        try:
            with self._change("delete", "connection", name) as cur:
                cur.execute("DELETE FROM gw_connections WHERE name = %s", (name,))
                if cur.rowcount == 0:
                    raise not_found("connection_not_found", f"connection '{name}' not found")
        except psycopg2.errors.ForeignKeyViolation:
            raise conflict("connection_in_use", f"saved queries use connection '{name}'") from None

    def _connection_doc(self, row: dict) -> dict:
        return {"name": row["name"], "db": row["db"], "active": row["active"], "host": row["host"],
                "port": row["port"], "database": row["database"], "user": row["username"],
                "password": None if row["password"] in (None, "") else "********",
                "options": row["options"], "created_at": _iso(row["created_at"]),
                "updated_at": _iso(row["updated_at"])}

    def get_connection(self, name: str) -> dict:
        with self._cursor() as cur:
            cur.execute("SELECT * FROM gw_connections WHERE name = %s", (name,))
            row = cur.fetchone()
        if row is None:
            raise not_found("connection_not_found", f"connection '{name}' not found")
        return self._connection_doc(row)

    def list_connections(self) -> dict:
        with self._cursor() as cur:
            cur.execute("SELECT * FROM gw_connections ORDER BY name")
            return {"items": [self._connection_doc(r) for r in cur.fetchall()]}

    # --- saved queries -----------------------------------------------------------------
    def _version_values(self, cur, body: dict, name: str) -> dict:
        _require_fields(body, QUERY_FIELDS)
        connection_name = body.get("connection_name")
        if not isinstance(connection_name, str):
            raise bad_request("invalid_body", "connection_name is required", errors={"connection_name": "is required"})
        cur.execute("SELECT * FROM gw_connections WHERE name = %s", (connection_name,))
        row = cur.fetchone()
        if row is None:
            raise not_found("connection_not_found", f"connection '{connection_name}' not found")
        specs = compile_specs(body.get("parameters"))
        text = sqlreader.read(body.get("sql"), frozenset(s.name for s in specs))
        masks = body.get("mask")
        compile_masks(masks)  # checked now; applied per key at plan time
        # Save-time analysis against the connection's schema (fails closed with its code).
        governance = self._analyze(Connection(row), text)
        description = body.get("description") or ""
        if not isinstance(description, str):
            raise bad_request("invalid_body", "description must be a string", errors={"description": "must be a string"})
        if "publish" in body and not isinstance(body["publish"], bool):
            raise bad_request("invalid_body", "publish must be true or false", errors={"publish": "must be true or false"})
        analysis = {"positional": text.text, "order": list(text.order), "kind": text.kind}
        extra = {"analysis": analysis, "governance": governance.to_doc()}
        if masks:
            extra["mask"] = masks
        max_rows = body.get("max_affected_rows")
        if max_rows is not None:
            if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 0:
                raise bad_request("invalid_body", "max_affected_rows must be a non-negative integer",
                                  errors={"max_affected_rows": "must be a non-negative integer"})
            extra["max_affected_rows"] = max_rows
        return {"connection_id": row["id"], "sql": body["sql"],
                "parameters": psycopg2.extras.Json({s.name: s.to_doc() for s in specs}),
                "description": description, "tags": psycopg2.extras.Json(_str_list(body, "tags")),
                "extra": psycopg2.extras.Json(extra)}

    def _analyze(self, connection: Connection, statement: sqlreader.Statement):
        """Save-time analysis against the connection's schema, read afresh."""
        return analyze(statement, self._schemas.fresh(connection), self._settings.search_path_tuple(),
                       denied_functions=self._settings.denied_functions(),
                       allowed_functions=self._settings.allowed_functions(),
                       allowed_catalog_relations=self._settings.allowed_catalog_relations())

    def _insert_version(self, cur, query_id: int, version: int, values: dict, publish: bool) -> None:
        values = dict(values, query_id=query_id, version=version)
        cols = ", ".join(values)
        cur.execute(f"INSERT INTO gw_query_versions ({cols}, published_at) VALUES "
                    f"({', '.join(['%s'] * len(values))}, {'now()' if publish else 'NULL'})", list(values.values()))
        if publish:
            cur.execute("UPDATE gw_queries SET published_version = %s, updated_at = now() WHERE id = %s",
                        (version, query_id))

    def create_query(self, body: dict) -> dict:
        name = _name(body, "query")
        try:
            with self._change("create", "query", name) as cur:
                values = self._version_values(cur, body, name)
                cur.execute("INSERT INTO gw_queries (name) VALUES (%s) RETURNING id", (name,))
                self._insert_version(cur, cur.fetchone()["id"], 1, values, body.get("publish") is True)
        except psycopg2.errors.UniqueViolation:
            raise conflict("query_exists", f"query '{name}' already exists") from None
        return self.get_query(name)

    def add_version(self, name: str, body: dict) -> dict:
        body = dict(body)
        if body.setdefault("name", name) != name:
            raise bad_request("invalid_body", "the body's name differs from the URL's", errors={"name": "must match"})
        with self._change("add_version", "query", name) as cur:
            query = self._query_row(cur, name, lock=True)
            cur.execute("SELECT max(version) AS v FROM gw_query_versions WHERE query_id = %s", (query["id"],))
            self._insert_version(cur, query["id"], cur.fetchone()["v"] + 1,
                                 self._version_values(cur, body, name), body.get("publish") is True)
        return self.get_query(name)

    def publish(self, name: str, body: dict) -> dict:
        version = body.get("version")
        with self._change("publish", "query", name) as cur:
            query = self._query_row(cur, name, lock=True)
            if version is None:
                cur.execute("SELECT max(version) AS v FROM gw_query_versions WHERE query_id = %s", (query["id"],))
                version = cur.fetchone()["v"]
            if isinstance(version, bool) or not isinstance(version, int):
                raise bad_request("invalid_body", "version must be an integer", errors={"version": "must be an integer"})
            cur.execute("UPDATE gw_query_versions SET published_at = coalesce(published_at, now()) "
                        "WHERE query_id = %s AND version = %s", (query["id"], version))
            if cur.rowcount == 0:
                raise not_found("version_not_found", f"query '{name}' has no version {version}")
            cur.execute("UPDATE gw_queries SET published_version = %s, updated_at = now() WHERE id = %s",
                        (version, query["id"]))
        return self.get_query(name)

    def unpublish(self, name: str) -> dict:
        with self._change("unpublish", "query", name) as cur:
            query = self._query_row(cur, name, lock=True)
            cur.execute("UPDATE gw_queries SET published_version = NULL, updated_at = now() WHERE id = %s",
                        (query["id"],))
        return self.get_query(name)

    def delete_query(self, name: str) -> None:
        with self._change("delete", "query", name) as cur:
            cur.execute("DELETE FROM gw_queries WHERE name = %s", (name,))
            if cur.rowcount == 0:
                raise not_found("query_not_found", f"query '{name}' not found")

    def _query_row(self, cur, name: str, lock: bool = False) -> dict:
        cur.execute("SELECT * FROM gw_queries WHERE name = %s" + (" FOR UPDATE" if lock else ""), (name,))
        row = cur.fetchone()
        if row is None:
            raise not_found("query_not_found", f"query '{name}' not found")
        return row

    def _query_doc(self, query: dict, versions: list[dict], detail: bool) -> dict:
        latest = versions[-1] if versions else {}
        published = query["published_version"]
        shown = next((v for v in versions if v["version"] == published), latest)
        doc = {"name": query["name"], "description": shown.get("description", ""), "query_type": "sql",
               "connection_name": shown.get("connection_name"), "tags": shown.get("tags", []),
               "published_version": published, "latest_version": latest.get("version"),
               "has_draft": (latest.get("version") or 0) > (published or 0), "version_count": len(versions),
               "endpoint": f"/q/{query['name']}", "created_at": _iso(query["created_at"]),
               "updated_at": _iso(query["updated_at"])}
        if detail:
            doc["versions"] = [{"version": v["version"], "connection_name": v["connection_name"], "sql": v["sql"],
                                "parameters": v["parameters"], "description": v["description"],
                                "tags": v["tags"], "kind": v["extra"]["analysis"]["kind"],
                                "max_affected_rows": v["extra"].get("max_affected_rows"),
                                "status": "published" if v["version"] == published else
                                ("draft" if v["published_at"] is None else "previously_published"),
                                "published_at": _iso(v["published_at"]), "created_at": _iso(v["created_at"])}
                               for v in versions]
        return doc

    _VERSIONS = ("SELECT v.*, c.name AS connection_name FROM gw_query_versions v "
                 "JOIN gw_connections c ON c.id = v.connection_id ")

    def get_query(self, name: str) -> dict:
        with self._cursor() as cur:
            query = self._query_row(cur, name)
            cur.execute(self._VERSIONS + "WHERE v.query_id = %s ORDER BY v.version", (query["id"],))
            return self._query_doc(query, cur.fetchall(), detail=True)

    def list_queries(self) -> dict:
        with self._cursor() as cur:
            cur.execute("SELECT * FROM gw_queries ORDER BY name")
            queries = cur.fetchall()
            cur.execute(self._VERSIONS + "ORDER BY v.query_id, v.version")
            by_query: dict[int, list] = {}
            for v in cur.fetchall():
                by_query.setdefault(v["query_id"], []).append(v)
        return {"items": [self._query_doc(q, by_query.get(q["id"], []), detail=False) for q in queries]}

    # --- audit and run history (read only) ---------------------------------------------
    def audit(self, args: dict) -> dict:
        where, values = _filters(args, {"kind": "kind = %s", "name": "name = %s", "action": "action = %s",
                                        "since": "at >= %s", "until": "at < %s"})
        with self._cursor() as cur:
            cur.execute(f"SELECT * FROM gw_audit {where} ORDER BY id DESC LIMIT %s", values + [_limit(args)])
            rows = cur.fetchall()
        return {"items": [dict(r, at=_iso(r["at"])) for r in rows]}

    def history(self, args: dict) -> dict:
        where, values = _filters(args, {"query": "h.query = %s", "key": "k.name = %s", "status": "h.status = %s",
                                        "code": "h.code = %s", "since": "h.at >= %s", "until": "h.at < %s"})
        with self._cursor() as cur:
            cur.execute("SELECT h.id, h.at, h.request_id, k.name AS key, h.query, h.version, h.status, h.code, "
                        "h.row_count, h.duration_ms, h.worker FROM gw_run_history h "
                        f"LEFT JOIN gw_api_keys k ON k.id = h.key_id {where} ORDER BY h.id DESC LIMIT %s",
                        values + [_limit(args)])
            rows = cur.fetchall()
        return {"items": [dict(r, at=_iso(r["at"])) for r in rows]}

    # --- API keys ----------------------------------------------------------------------
    def _grants(self, body: dict, base: dict | None = None) -> dict:
        grants = dict(base or {})
        for field in ("queries", "connections"):
            if field in body or base is None:
                grants[field] = _str_list(body, field)
        for field in ("active", "allow_writes"):
            if field in body:
                if not isinstance(body[field], bool):
                    raise bad_request("invalid_body", f"{field} must be true or false",
                                      errors={field: "must be true or false"})
                grants[field] = body[field]
        if "rate_limit" in body or "rate_limit_burst" in body:
            rate_text = body.get("rate_limit", grants.get("rate_limit"))
            burst = body.get("rate_limit_burst", grants.get("rate_limit_burst"))
            if rate_text is None:
                grants.pop("rate_limit", None)
                grants.pop("rate_limit_burst", None)
            else:
                Rate.parse(rate_text, burst)  # checked now, so the catalog never holds a bad one
                grants["rate_limit"] = rate_text
                grants["rate_limit_burst"] = burst
        for field in GOVERNANCE_FIELDS:
            if field in body:
                if body[field] is None:
                    grants.pop(field, None)
                else:
                    grants[field] = body[field]
        Grants.from_doc(grants)  # checked now, so the catalog never holds a bad one
        if "quota" in body:
            if body["quota"] is None:
                grants.pop("quota", None)
            else:
                grants["quota"] = Quota.parse(body["quota"]).to_doc()
        return grants

    def create_key(self, body: dict) -> dict:
        _require_fields(body, KEY_FIELDS)
        name = _name(body, "key")
        grants = self._grants(body)
        secret, prefix = crypto.new_api_secret()
        try:
            with self._change("create", "key", name) as cur:
                cur.execute("INSERT INTO gw_api_keys (name, prefix, secret_hash, grants, expires_at) "
                            "VALUES (%s, %s, %s, %s, %s)",
                            (name, prefix, crypto.digest(secret), psycopg2.extras.Json(grants), _expires(body)))
        except psycopg2.errors.UniqueViolation:
            raise conflict("key_exists", f"API key '{name}' already exists") from None
        return dict(self.get_key(name), secret=secret)

    def update_key(self, name: str, body: dict) -> dict:
        _require_fields(body, KEY_FIELDS)
        if body.get("name", name) != name:
            raise bad_request("invalid_body", "a key cannot be renamed", errors={"name": "cannot change"})
        with self._change("update", "key", name) as cur:
            row = self._key_row(cur, name, lock=True)
            grants = self._grants(body, base=row["grants"])
            expires = _expires(body) if "expires_at" in body else row["expires_at"]
            cur.execute("UPDATE gw_api_keys SET grants = %s, expires_at = %s WHERE id = %s",
                        (psycopg2.extras.Json(grants), expires, row["id"]))
        return self.get_key(name)

    def rotate_key(self, name: str) -> dict:
        secret, prefix = crypto.new_api_secret()
        with self._change("rotate", "key", name) as cur:
            row = self._key_row(cur, name, lock=True)
            cur.execute("UPDATE gw_api_keys SET prefix = %s, secret_hash = %s, rotated_at = now() WHERE id = %s",
                        (prefix, crypto.digest(secret), row["id"]))
        return dict(self.get_key(name), secret=secret)

    def delete_key(self, name: str) -> None:
        with self._change("delete", "key", name) as cur:
            cur.execute("DELETE FROM gw_api_keys WHERE name = %s", (name,))
            if cur.rowcount == 0:
                raise not_found("key_not_found", f"API key '{name}' not found")

    def _key_row(self, cur, name: str, lock: bool = False) -> dict:
        cur.execute("SELECT * FROM gw_api_keys WHERE name = %s" + (" FOR UPDATE" if lock else ""), (name,))
        row = cur.fetchone()
        if row is None:
            raise not_found("key_not_found", f"API key '{name}' not found")
        return row

    @staticmethod
    def _key_doc(row: dict) -> dict:
        grants = row["grants"] or {}
        expires = row["expires_at"]
        return {"name": row["name"], **{k: v for k, v in grants.items() if k != "active"},
                "active": grants.get("active", True) is not False, "expires_at": _iso(expires),
                "expired": bool(expires and expires <= datetime.now(timezone.utc)),
                "created_at": _iso(row["created_at"]), "rotated_at": _iso(row["rotated_at"]),
                "key_prefix": f"gw_{row['prefix']}_"}

    def get_key(self, name: str) -> dict:
        with self._cursor() as cur:
            return self._key_doc(self._key_row(cur, name))

    def list_keys(self) -> dict:
        with self._cursor() as cur:
            cur.execute("SELECT * FROM gw_api_keys ORDER BY name")
            return {"items": [self._key_doc(r) for r in cur.fetchall()]}


__all__ = ["Management", "GatewayError"]
