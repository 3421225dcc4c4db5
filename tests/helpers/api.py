"""One client of the Management API and the data plane, as a user's script drives them, over
either transport: in process (``falcon.testing``) or real HTTP (``requests``, to a gunicorn
master, ``fleet up``'s nginx, ...)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import falcon.testing
import requests

from helpers.util import ADMIN_KEY, PASSWORD_ENV, unique

NO_BODY = object()
OK = (200, 201, 204)


class Reply:
    """The parts of a response the tests look at, from either transport."""

    __slots__ = ("status", "headers", "content")

    def __init__(self, status: int, headers, content: bytes):
        self.status = status
        self.headers = headers
        self.content = content

    @property
    def json(self):
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode()

    def __repr__(self):
        return f"<Reply {self.status} {self.content[:300]!r}>"


class Api:
    """The Management API (with the admin key) and the data plane, and factories of
    connections (to ``services``' data database), queries and keys.

    ``send(method, path, *, params, json_body, body, headers, query_string) -> Reply`` is the
    transport: ``Api.in_process(client, services)`` or ``Api.over_http(base, services)``.
    """

    def __init__(self, send, services, close=lambda: None):
        self._send = send
        self._close = close
        self.services = services
        self.admin = {"X-API-Key": ADMIN_KEY}

    @classmethod
    def in_process(cls, client: falcon.testing.TestClient, services) -> Api:
        def send(method, path, *, params, json_body, body, headers, query_string):
            kwargs = {"headers": headers}
            if params is not None:
                kwargs["params"] = params
            if query_string is not None:
                kwargs["query_string"] = query_string
            if json_body is not NO_BODY:
                kwargs["json"] = json_body
            elif body is not None:
                kwargs["body"] = body
            result = client.simulate_request(method, path, **kwargs)
            return Reply(result.status_code, result.headers, result.content)
        return cls(send, services)

    @classmethod
    def over_http(cls, base: str, services) -> Api:
        """Real HTTP to ``base`` on one keep-alive ``requests.Session`` (``close()`` it)."""
        base = base.rstrip("/")
        session = requests.Session()

        def send(method, path, *, params, json_body, body, headers, query_string):
            url = base + path + (f"?{query_string}" if query_string else "")
            kwargs = {"headers": headers, "params": params, "timeout": 60}
            if json_body is not NO_BODY:
                kwargs["json"] = json_body
            elif body is not None:
                kwargs["data"] = body
            response = session.request(method, url, **kwargs)
            return Reply(response.status_code, response.headers, response.content)
        return cls(send, services, session.close)

    def close(self) -> None:
        self._close()

    # --- raw -----------------------------------------------------------------------------
    def request(self, method: str, path: str, *, params=None, json_body=NO_BODY, body=None,
                headers=None, query_string=None) -> Reply:
        return self._send(method, path, params=params, json_body=json_body, body=body,
                          headers=headers or {}, query_string=query_string)

    def manage(self, method: str, path: str, json_body=NO_BODY, **kw) -> Reply:
        return self.request(method, "/api/v1" + path, json_body=json_body,
                            headers={**self.admin, **kw.pop("headers", {})}, **kw)

    def ok(self, method: str, path: str, json_body=NO_BODY, **kw) -> Reply:
        """``manage``, and the answer must be a success (200, 201 or 204)."""
        reply = self.manage(method, path, json_body, **kw)
        assert reply.status in OK, f"{method} {path}: {reply.status} {reply.content[:500]!r}"
        return reply

    def call(self, name: str, secret: str | None, params=None, **kw) -> Reply:
        """GET /q/<name> with the query string ``params``."""
        headers = {"X-API-Key": secret} if secret else {}
        return self.request("GET", f"/q/{name}", params=params, headers={**headers, **kw.pop("headers", {})}, **kw)

    def post(self, name: str, secret: str | None, body) -> Reply:
        headers = {"X-API-Key": secret} if secret else {}
        return self.request("POST", f"/q/{name}", json_body=body, headers=headers)

    def adhoc(self, secret: str, body) -> Reply:
        """POST /execute_sql with ``body``."""
        return self.request("POST", "/execute_sql", json_body=body, headers={"X-API-Key": secret})

    # --- factories -----------------------------------------------------------------------
    def connection(self, name: str | None = None, **fields) -> str:
        name = name or unique("conn")
        doc = {"name": name, "db": "postgres", "host": "127.0.0.1", "port": self.services.pg.port,
               "database": self.services.data_database, "user": "postgres",
               "password": f"${{{PASSWORD_ENV}}}", **fields}
        reply = self.manage("POST", "/connections", doc)
        assert reply.status == 201, reply
        return name

    def query(self, sql: str, parameters: dict | None = None, connection: str | None = None,
              publish: bool = True, name: str | None = None, **fields) -> str:
        name = name or unique("q")
        doc = {"name": name, "connection_name": connection or self.connection(), "sql": sql,
               "parameters": parameters or {}, "publish": publish, **fields}
        reply = self.manage("POST", "/queries", doc)
        assert reply.status == 201, reply
        return name

    def key(self, queries=(), connections=(), name: str | None = None, **fields) -> str:
        """A new key granted ``queries`` and ``connections``; its secret."""
        return self.named_key(queries, connections, name, **fields)[1]

    def named_key(self, queries=(), connections=(), name: str | None = None, **fields) -> tuple[str, str]:
        """A new key granted ``queries`` and ``connections``; (its name, its secret)."""
        name = name or unique("key")
        doc = {"name": name, "queries": list(queries), "connections": list(connections), **fields}
        reply = self.manage("POST", "/api-keys", doc)
        assert reply.status == 201, reply
        return name, reply.json["secret"]

    def endpoint(self, sql: str, parameters: dict | None = None, **query_fields) -> SimpleNamespace:
        """Connection + published query + a key granted both; returns names and the secret."""
        connection = query_fields.pop("connection", None) or self.connection()
        query = self.query(sql, parameters, connection=connection, **query_fields)
        key_name, secret = self.named_key([query], [connection])
        return SimpleNamespace(query=query, connection=connection, key=key_name, secret=secret)
