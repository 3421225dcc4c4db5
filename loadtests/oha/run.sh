#!/bin/sh
# oha scenarios: closed loop for throughput, open loop (latency-corrected) for latency against offered load.
#
# In docker compose (compose/docker-compose.override.yml, profile `bench`), inside the oha image:
#   docker compose --profile bench run --rm oha
#   docker compose --profile bench run --rm -e SCENARIOS="lookup page" -e DURATION=30s oha
# Anywhere oha is installed:
#   TARGET=http://127.0.0.1:8000 KEYS_FILE=.bench/keys.env OUT=/tmp/oha-run sh loadtests/oha/run.sh
#   DRY_RUN=1 ... sh loadtests/oha/run.sh         # print the oha command lines, run nothing
#
# It needs only /bin/sh and oha (no sed, grep or awk: the oha image is fedora-minimal with oha as its
# entrypoint, so compose overrides the entrypoint with /bin/sh; where an image has no shell at all, call oha
# directly with the command lines DRY_RUN=1 prints, one service or `run` per scenario).
#
# Keys: KEYS_FILE (default /results/keys.env, else <the loadtests mount>/../.bench/keys.env) holds KEY_PLAIN=...
# KEY_GOVERNED=... KEY_WRITER=..., written by `python -m loadtests.scenarios.provision --url ... --out FILE`
# (the account_page, deposit and account_governed queries and their keys). Without it, KEY_PLAIN falls back to
# the demo key (FLEET_DEMO_KEY_FILE, written by compose's `seed`), which reaches /q/account only: the other
# scenarios are skipped, and say so.
#
# Method (QueryAPIGate's Performance v3): a warm-up per scenario, a /health floor before and after, ROUNDS
# closed-loop rounds (-c CONNECTIONS -z DURATION) with the scenarios in an order rotated each round; then per
# scenario the open loop at OPEN_PCTS percent of its capacity (CAPACITY, or the median of its closed-loop rounds):
# -q RATE --latency-correction -c OPEN_CONNECTIONS -z OPEN_DURATION, OPEN_ROUNDS rounds, rates rotated each round.
# `--latency-correction` measures each request from when it should have been sent, so a slow answer does not hide
# the queue behind it (coordinated omission). Requests still in flight at the end of -z are aborted by oha and
# counted neither way (loadtests/blocks/oha/run.py).
#
# Output: OUT/<mode>-<scenario>-<n>.json (oha's JSON), OUT/runs.tsv (one line per run) and OUT/settings.env;
#   .venv/bin/python -m loadtests.bench oha OUT       # -> OUT/results.jsonl, results.md, openloop.png
set -eu

HERE=${0%/*}
[ "$HERE" = "$0" ] && HERE=.
TARGET=${TARGET:-${FLEET_TARGET_URL:-http://lb:8080}}
TARGET=${TARGET%/}
SCENARIOS=${SCENARIOS:-lookup page deposit}
MODES=${MODES:-closed open}
ROUNDS=${ROUNDS:-5}
CONNECTIONS=${CONNECTIONS:-32}
DURATION=${DURATION:-30s}
WARMUP=${WARMUP:-5s}
WARMUP_CONNECTIONS=${WARMUP_CONNECTIONS:-8}
FLOOR=${FLOOR:-10s}
OPEN_PCTS=${OPEN_PCTS:-25 50 75 90 100 110}
OPEN_ROUNDS=${OPEN_ROUNDS:-$ROUNDS}
OPEN_DURATION=${OPEN_DURATION:-20s}
OPEN_CONNECTIONS=${OPEN_CONNECTIONS:-128}
CAPACITY=${CAPACITY:-}
OHA=${OHA:-oha}
DRY_RUN=${DRY_RUN:-0}

say() { printf '%s\n' "oha/run.sh: $*" >&2; }
die() { say "$*"; exit 1; }

# A file's contents with shell builtins only.
slurp() {
    _text=
    while IFS= read -r _line || [ -n "$_line" ]; do _text="$_text$_line
"; done < "$1"
    printf '%s' "$_text"
}

# A number after "key": in oha's pretty JSON (first match), or empty.
json_number() {
    case "$1" in *"\"$2\":"*) ;; *) return 0 ;; esac
    _v=${1#*\"$2\":}
    _v=${_v# }
    _v=${_v%%[,
\}]*}
    printf '%s' "$_v"
}

# The median of integers, with shell arithmetic only.
median() {
    _n=$#
    _half=$((_n / 2))
    for _v in "$@"; do
        _lt=0; _le=0
        for _u in "$@"; do
            if [ "$_u" -lt "$_v" ]; then _lt=$((_lt + 1)); fi
            if [ "$_u" -le "$_v" ]; then _le=$((_le + 1)); fi
        done
        if [ "$_lt" -le "$_half" ] && [ "$_half" -lt "$_le" ]; then printf '%s' "$_v"; return 0; fi
    done
    return 0
}

# The words of $1 rotated left by $2 places.
rotate() {
    _k=$2
    set -- $1
    _k=$((_k % $#))
    _i=0; _head=; _tail=
    for _x in "$@"; do
        if [ "$_i" -lt "$_k" ]; then _tail="$_tail $_x"; else _head="$_head $_x"; fi
        _i=$((_i + 1))
    done
    printf '%s' "$_head$_tail"
}

# --- where results go ------------------------------------------------------------------
stamp() { date +%Y%m%d-%H%M%S 2>/dev/null || printf 'run-%s' "$$"; }
if [ -z "${OUT:-}" ]; then
    if [ -d /results ] && [ -w /results ]; then OUT=/results/oha-$(stamp); else OUT=${TMPDIR:-/tmp}/oha-$(stamp); fi
fi
mkdir -p "$OUT" 2>/dev/null || die "cannot create $OUT"

# --- keys ------------------------------------------------------------------------------
if [ -z "${KEYS_FILE:-}" ]; then
    for candidate in /results/keys.env "$HERE/../../.bench/keys.env"; do
        if [ -r "$candidate" ]; then KEYS_FILE=$candidate; break; fi
    done
fi
if [ -n "${KEYS_FILE:-}" ]; then
    [ -r "$KEYS_FILE" ] || die "KEYS_FILE $KEYS_FILE is not readable"
    . "$KEYS_FILE"
    say "keys from $KEYS_FILE"
fi
if [ -z "${KEY_PLAIN:-}" ] && [ -r "${FLEET_DEMO_KEY_FILE:-/nonexistent}" ]; then
    KEY_PLAIN=$(slurp "$FLEET_DEMO_KEY_FILE")
    KEY_PLAIN=${KEY_PLAIN%%[!A-Za-z0-9_-]*}
    say "KEY_PLAIN from the demo key ($FLEET_DEMO_KEY_FILE): it reaches /q/account only"
fi

# --- oha -------------------------------------------------------------------------------
if [ "$DRY_RUN" = 1 ]; then
    FORMAT="--output-format json"
    OHA_VERSION="(dry run)"
else
    command -v "$OHA" >/dev/null 2>&1 || die "oha not found (OHA=$OHA). Locally: closed loop with wrk \
(python -m loadtests.bench), open loop with python -m loadtests.bench openloop"
    _help=$("$OHA" --help 2>&1 || true)
    case "$_help" in
        *--output-format*) FORMAT="--output-format json" ;;
        *) FORMAT="--json" ;;   # oha before --output-format
    esac
    OHA_VERSION=$("$OHA" --version 2>&1 || true)
fi

scenario() {   # loads scenarios/$1.env: KEY_VAR, URL_PATH, STATIC; sets KEY, URL; fails when the key is missing
    KEY_VAR=; URL_PATH=; STATIC=; KEY=
    [ -r "$HERE/scenarios/$1.env" ] || die "no scenario $1 (loadtests/oha/scenarios/*.env)"
    . "$HERE/scenarios/$1.env"
    URL=$TARGET$URL_PATH
    if [ -n "$KEY_VAR" ]; then
        eval "KEY=\${$KEY_VAR:-}"
        [ -n "$KEY" ] || return 1
    fi
    return 0
}

run_no=0
# run MODE SCENARIO ROUND CONNECTIONS RATE PCT DURATION: one oha run, its line in runs.tsv and a summary line
run() {
    _mode=$1; _scn=$2; _round=$3; _c=$4; _rate=$5; _pct=$6; _dur=$7
    run_no=$((run_no + 1))
    _file=$OUT/$_mode-$_scn-$run_no.json
    set -- --no-tui $FORMAT -c "$_c" -z "$_dur"
    if [ -n "$_rate" ]; then set -- "$@" -q "$_rate" --latency-correction; fi
    if [ -n "$KEY" ]; then set -- "$@" -H "X-API-Key: $KEY"; fi
    if [ -z "$STATIC" ]; then set -- "$@" --rand-regex-url; fi
    set -- "$@" "$URL"
    if [ "$DRY_RUN" = 1 ]; then
        printf '%s' "$OHA" ; for _a in "$@"; do case "$_a" in X-API-Key:*) _a="X-API-Key: \$$KEY_VAR" ;; esac
            printf " '%s'" "$_a"; done; printf ' > %s\n' "$_file"
        printf '1000' > "$_file.rps"
    else
        "$OHA" "$@" > "$_file" 2> "$_file.err" || die "oha failed on $_mode $_scn: $(slurp "$_file.err")"
        _json=$(slurp "$_file")
        _rps=$(json_number "$_json" requestsPerSec)
        printf '%s' "${_rps%%.*}" > "$_file.rps"
        say "$_mode $_scn round $_round c=$_c${_rate:+ q=$_rate ($_pct%)}: ${_rps%%.*} req/s, p50 \
$(json_number "$_json" p50) s, p99 $(json_number "$_json" p99) s, success rate $(json_number "$_json" successRate)"
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$_mode" "$_scn" "$_round" "$_c" "${_rate:-}" "${_pct:-}" "$_dur" \
        "${_file##*/}" >> "$OUT/runs.tsv"
}

# --- the block -------------------------------------------------------------------------
live=
for s in $SCENARIOS; do
    if scenario "$s"; then live="$live $s"; else say "skipping $s: no $KEY_VAR (KEYS_FILE from loadtests.scenarios.provision)"; fi
done
[ -n "$live" ] || die "no scenario can run: give KEYS_FILE or KEY_PLAIN"
printf 'mode\tscenario\tround\tconnections\trate\tpct\tduration\tfile\n' > "$OUT/runs.tsv"
{
    printf 'TARGET=%s\nSCENARIOS="%s"\nMODES="%s"\nROUNDS=%s\nCONNECTIONS=%s\nDURATION=%s\n' \
        "$TARGET" "$live" "$MODES" "$ROUNDS" "$CONNECTIONS" "$DURATION"
    printf 'WARMUP=%s\nFLOOR=%s\nOPEN_PCTS="%s"\nOPEN_ROUNDS=%s\nOPEN_DURATION=%s\nOPEN_CONNECTIONS=%s\n' \
        "$WARMUP" "$FLOOR" "$OPEN_PCTS" "$OPEN_ROUNDS" "$OPEN_DURATION" "$OPEN_CONNECTIONS"
    printf 'CAPACITY=%s\nOHA_VERSION="%s"\nSTARTED="%s"\n' "$CAPACITY" "$OHA_VERSION" "$(stamp)"
} > "$OUT/settings.env"
say "scenarios:$live -> $OUT"

for s in $live; do
    scenario "$s"
    [ "$WARMUP" = 0 ] || run warmup "$s" 0 "$WARMUP_CONNECTIONS" "" "" "$WARMUP"
done
if [ "$FLOOR" != 0 ]; then scenario health; run floor health before "$CONNECTIONS" "" "" "$FLOOR"; fi

case " $MODES " in *" closed "*)
    r=0
    while [ "$r" -lt "$ROUNDS" ]; do
        for s in $(rotate "$live" "$r"); do
            scenario "$s"
            run closed "$s" $((r + 1)) "$CONNECTIONS" "" "" "$DURATION"
        done
        r=$((r + 1))
    done
;; esac

case " $MODES " in *" open "*)
    for s in $live; do
        scenario "$s"
        cap=$CAPACITY
        if [ -z "$cap" ]; then
            rates=
            for f in "$OUT"/closed-"$s"-*.json.rps; do [ -r "$f" ] && rates="$rates $(slurp "$f")"; done
            [ -n "$rates" ] || die "open loop for $s needs its capacity: run MODES=\"closed open\" or set CAPACITY"
            cap=$(median $rates)
        fi
        say "open loop for $s at $OPEN_PCTS % of $cap req/s"
        r=0
        while [ "$r" -lt "$OPEN_ROUNDS" ]; do
            for pct in $(rotate "$OPEN_PCTS" "$r"); do
                rate=$((cap * pct / 100))
                [ "$rate" -ge 1 ] || rate=1
                run open "$s" $((r + 1)) "$OPEN_CONNECTIONS" "$rate" "$pct" "$OPEN_DURATION"
            done
            r=$((r + 1))
        done
    done
;; esac

if [ "$FLOOR" != 0 ]; then scenario health; run floor health after "$CONNECTIONS" "" "" "$FLOOR"; fi
say "done: $OUT (python -m loadtests.bench oha $OUT makes results.jsonl, results.md and the plots)"
