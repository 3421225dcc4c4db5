"""What the tests share besides fixtures (those live in ``tests/conftest.py``).

``tests/`` is on ``sys.path`` (pytest's default ``prepend`` import mode puts the folder of
``conftest.py`` there, as ``tests/`` has no ``__init__.py``), so a test module anywhere below
imports ``from helpers.api import Api``.

- ``util``: the repository root, the session's keys, ``unique``, ``free_port``, ``wait_until``;
- ``services``: PostgreSQL and Redis through ``fleet.ops.local`` (``start_services``), the ports;
- ``api``: ``Api``, the one client of the Management API and the data plane (in process or HTTP);
- ``masters``: real gunicorn masters (``Master``, ``start_masters``);
- ``load``: load generators (``Load``, ``Callers``) and counting what they saw;
- ``history``: the store's run history and keys;
- ``events``: a server-sent events reader for ``GET /events``;
- ``procs``: processes as /proc shows them.
"""
