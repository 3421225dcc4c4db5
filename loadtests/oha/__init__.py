"""oha scenarios (run.sh, scenarios/*.env), the collector of their JSON (collect.py) and a small open-loop generator
in Python for machines without oha (openloop.py). See loadtests/README.md, "Open loop"."""
