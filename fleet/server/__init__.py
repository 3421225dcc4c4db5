"""The HTTP server of a worker: gunicorn's threaded worker with the front (``front``,
``front_worker``), the lean request path (``lean``, ``lean_request``), the balancing of one
master's workers (``slots``), handover and graceful stop (``worker``), the port that listens
only once a worker serves (``listen``), the cheaper boot (``boot``), and gunicorn's
configuration (``gunicorn_conf``). Written against one gunicorn version: ``GUNICORN_VERSION``.
"""
