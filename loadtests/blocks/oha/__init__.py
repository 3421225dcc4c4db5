"""Block `oha`: open and closed loop with oha, the reference for latency against offered load. It runs as
loadtests/oha/run.sh with the scenarios of loadtests/oha/scenarios/*.env (shell and oha only: compose's `bench`
profile mounts that folder); ``python -m loadtests.bench oha FOLDER`` turns its output into results.jsonl and
results.md (run.py, render.py). See loadtests/README.md, "Open loop"."""
