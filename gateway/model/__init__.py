"""The model: the worker's catalog snapshot and the values it is made of (keys, queries and
their versions, connections, typed parameters, rates and quotas, who made a change).

A regular package (this file), not a namespace one: ``setup.cfg``'s ``packages = find:``
ships only folders with an ``__init__.py``, so without it the wheel lacked ``gateway.model``
(tests/test_imports.py checks every folder of the product)."""
