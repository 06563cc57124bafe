#!/usr/bin/env bash
# Wait until a cuzk-mp daemon serves, or give up.
#
#   scripts/wait-ready.sh [--connect ADDR] [--token TOKEN] [--timeout SECONDS] [--interval SECONDS]
#
# ADDR is what `cuzk-mp client --connect` takes (unix:///path or host:port; default
# $CUZK_MP_CONNECT or 127.0.0.1:9820); TOKEN as `client --token` (default $CUZK_MP_TOKEN). Polls
# `cuzk-mp client ready`, which succeeds once the daemon has started its engine, resubmitted
# journaled jobs, preloaded its keys and listens. Exit 0 when ready, 1 on timeout (the last
# answer is printed), 2 at once when waiting cannot help: the daemon refuses the call (a token
# missing or wrong), the client the address, or an argument is bad. $CUZK_MP overrides the
# command (default: cuzk-mp), e.g. CUZK_MP="python -m cuzk_mp.cli".
set -euo pipefail

connect="${CUZK_MP_CONNECT:-127.0.0.1:9820}"
timeout=300
interval=0.5
bad() { echo "wait-ready.sh: $*" >&2; exit 2; }  # a usage error: exit 2, never 1 (not ready in time)
while [[ $# -gt 0 ]]; do
  case "$1" in
    --connect|--token|--timeout|--interval) [[ $# -ge 2 ]] || bad "$1 needs a value" ;;
  esac
  case "$1" in
    --connect) connect="$2"; shift 2 ;;
    --token) export CUZK_MP_TOKEN="$2"; shift 2 ;;
    --timeout) timeout="$2"; shift 2 ;;
    --interval) interval="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p;}' "$0"; exit 0 ;;
    *) bad "unknown argument $1" ;;
  esac
done
seconds='^[0-9]+(\.[0-9]+)?$'
[[ "$timeout" =~ $seconds ]] || bad "--timeout needs a number of seconds, not '$timeout'"
[[ "$interval" =~ $seconds ]] || bad "--interval needs a number of seconds, not '$interval'"
read -r -a cuzk <<< "${CUZK_MP:-cuzk-mp}"
if ! command -v "${cuzk[0]}" > /dev/null; then  # no retry can help: say so at once
  echo "wait-ready.sh: cannot run '${cuzk[0]}': not found (put cuzk-mp on PATH or set \$CUZK_MP)" >&2
  exit 2
fi

deadline=$(( $(date +%s) + ${timeout%.*} ))
last=""
while :; do
  code=0
  last=$("${cuzk[@]}" client ready --connect "$connect" 2>&1) || code=$?
  if (( code == 0 )); then
    echo "cuzk-mp daemon at $connect is ready"
    exit 0
  fi
  if (( code == 2 )); then  # the daemon refused the call (a token), or the client the address: say which
    echo "wait-ready.sh: waiting cannot help (\`client ready --connect $connect\` exits 2): ${last}" >&2
    exit 2
  fi
  if (( $(date +%s) >= deadline )); then
    echo "wait-ready.sh: daemon at $connect not ready after ${timeout}s: ${last}" >&2
    exit 1
  fi
  sleep "$interval"
done
