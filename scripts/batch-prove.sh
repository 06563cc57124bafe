#!/usr/bin/env bash
# Prove a directory of inputs through a running cuzk-mp daemon, N jobs in flight, resumable.
# `scripts/batch-prove.sh --help` for the usage.
set -euo pipefail

usage() {
  cat <<'EOF_USAGE'
usage: batch-prove.sh --circuit ID --out OUT_DIR [--connect ADDR] [-j N] [--verify]
                      [--priority P] [--timeout S] INPUT_DIR
       (options and INPUT_DIR in any order; --opt=VALUE works too)

Each entry of INPUT_DIR is one job:
  NAME.json / NAME.wtns   a job of one partition (circom input JSON, or a witness)
  NAME/                   a job whose partitions are NAME/*.json|*.wtns in name order
Results go to OUT_DIR/NAME/: proof_<i>.json, public_<i>.json, verification_key.json (snarkjs
JSON), result.json (the job summary), client.log, and a .done marker once complete (and, with
--verify, every proof verified by `cuzk-mp groth16 verify`).

Resumable: entries with a .done marker are skipped. A job's request id is
batch-<start of NAME>-<hash>-<attempt>, the hash (SHA-256) covering the circuit id, NAME and
the name and content of every input file: a rerun after an interruption re-attaches to the job
the daemon already has (no proof is computed twice), two entries never share an id however
alike their names, and an input changed since the last run is a new job. An entry whose job
failed (the client's exit 1 or 2, or a proof that does not verify) gets a new attempt; one that
was only not waited for to its end (an interruption, --timeout, the daemon unreachable or at its
cap on unfinished jobs: exit 3), or proved with its files not written here (a full disk), keeps
its id, so the rerun re-attaches to it (or, refused at a cap, sends it again).

  --connect ADDR   unix:///path or host:port (default $CUZK_MP_CONNECT or 127.0.0.1:9820)
  -j, --jobs N     jobs in flight (default 4)
  --verify         check every proof with `cuzk-mp groth16 verify` before marking it done
  --priority P     CRITICAL, HIGH, NORMAL or LOW (default: the circuit's)
  --timeout S      give up waiting for a job after S seconds (it goes on in the daemon)

Exit 0 if every entry is done, 1 if any is not, 2 on bad arguments, 130 when interrupted (SIGINT or
SIGTERM: the jobs in flight stop being waited for, and go on in the daemon; none more is started).
$CUZK_MP overrides the command (default: cuzk-mp), e.g. CUZK_MP="python -m cuzk_mp".
EOF_USAGE
}

connect="${CUZK_MP_CONNECT:-127.0.0.1:9820}"
jobs=4
verify=0
priority=""
timeout=""
circuit=""
out=""
input=""
bad() { echo "batch-prove.sh: $*" >&2; echo "batch-prove.sh: --help for the usage" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  arg="$1"; shift
  value=""
  case "$arg" in
    --*=*) value="${arg#*=}"; arg="${arg%%=*}" ;;
    -j?*) value="${arg#-j}"; arg="-j" ;;
    --circuit|--out|--connect|-j|--jobs|--priority|--timeout)
      [[ $# -gt 0 ]] || bad "$arg needs a value"
      value="$1"; shift ;;
  esac
  case "$arg" in
    --circuit) circuit="$value" ;;
    --out) out="$value" ;;
    --connect) connect="$value" ;;
    -j|--jobs) jobs="$value" ;;
    --priority) priority="$value" ;;
    --timeout) timeout="$value" ;;
    --verify) verify=1 ;;
    -h|--help) usage; exit 0 ;;
    --) for arg in "$@"; do [[ -z "$input" ]] || bad "one INPUT_DIR only"; input="$arg"; done
        shift $# ;;
    -*) bad "unknown option $arg" ;;
    *) [[ -z "$input" ]] || bad "one INPUT_DIR only"
       input="$arg" ;;
  esac
done
[[ -n "$circuit" ]] || bad "--circuit ID is required"
[[ -n "$out" ]] || bad "--out OUT_DIR is required"
[[ -n "$input" ]] || bad "INPUT_DIR is required"
[[ -d "$input" ]] || bad "$input is not a directory"
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || bad "-j needs a positive integer, not '$jobs'"
# what the client would refuse for every job is refused here, once: not each entry failed anew
[[ -z "$priority" || "$priority" =~ ^(CRITICAL|HIGH|NORMAL|LOW)$ ]] \
  || bad "--priority needs CRITICAL, HIGH, NORMAL or LOW, not '$priority'"
[[ -z "$timeout" || "$timeout" =~ ^[0-9]+(\.[0-9]+)?$ ]] || bad "--timeout needs a number of seconds, not '$timeout'"
read -r -a bp_cmd <<< "${CUZK_MP:-cuzk-mp}"
command -v "${bp_cmd[0]}" > /dev/null || bad "cannot run '${bp_cmd[0]}': not found (put cuzk-mp on PATH or set \$CUZK_MP)"
mkdir -p "$out"
export BP_CONNECT="$connect" BP_CIRCUIT="$circuit" BP_OUT="$out" BP_VERIFY="$verify" \
       BP_PRIORITY="$priority" BP_TIMEOUT="$timeout" BP_CUZK="${CUZK_MP:-cuzk-mp}"

# The request id of an entry (NAME and its input files): see the usage text.
request_id() {
  local name="$1" attempt="$2" f digest
  shift 2
  digest=$({
    printf '%s\0%s\0' "$BP_CIRCUIT" "$name"
    for f in "$@"; do
      printf '%s\0' "${f##*/}"
      sha256sum < "$f" | cut -d' ' -f1
    done
  } | sha256sum | cut -c1-40)
  echo "batch-$(printf '%s' "$name" | tr -c 'A-Za-z0-9_.-' '_' | cut -c1-24)-${digest}-${attempt}"
}
export -f request_id

# Whether the job is done: its summary says so, or, where the summary is not there to say it (the full
# disk that took the job's files took result.json too), the daemon does. The daemon's answer is kept in
# memory, not in a file on that disk, and read whole (no early-exiting reader to break its pipe).
job_done() {
  local summary="$1" rid="$2" answer
  grep -q '^ "state": "done"' "$summary" 2> /dev/null && return 0
  answer=$("${cuzk[@]}" client await "$rid" --connect "$BP_CONNECT" --timeout 0 2> /dev/null) || true
  [[ "$answer" == *$'\n "state": "done",'* ]]
}
export -f job_done

# One job: prove an entry, write its files, verify, mark it done. Runs in a child bash.
prove_one() {
  local entry="$1" base name dir attempt rid rc
  trap : TERM HUP  # its group's signal stops the client's wait; this shell lives on to mark the entry pending
  read -r -a cuzk <<< "$BP_CUZK"
  base=$(basename "$entry")
  name="${base%.*}"
  [[ -d "$entry" ]] && name="$base"
  dir="$BP_OUT/$name"
  [[ -f "$dir/.done" ]] && { echo "[skip] $name (done)"; return 0; }
  mkdir -p "$dir"
  attempt=$(cat "$dir/.attempt" 2>/dev/null || echo 1)
  if [[ -f "$dir/.failed" ]]; then
    attempt=$((attempt + 1)); rm -f "$dir/.failed"
  fi
  rm -f "$dir/.pending"
  echo "$attempt" > "$dir/.attempt"
  local -a files=("$entry") extra=()
  if [[ -d "$entry" ]]; then
    mapfile -t files < <(find "$entry" -maxdepth 1 -type f \( -name '*.json' -o -name '*.wtns' \) | sort)
  fi
  rid=$(request_id "$name" "$attempt" "${files[@]}")
  [[ -n "$BP_PRIORITY" ]] && extra+=(--priority "$BP_PRIORITY")
  [[ -n "$BP_TIMEOUT" ]] && extra+=(--timeout "$BP_TIMEOUT")
  rc=0
  "${cuzk[@]}" client prove --connect "$BP_CONNECT" --circuit "$BP_CIRCUIT" --out "$dir" \
      --request-id "$rid" "${extra[@]}" "${files[@]}" > "$dir/result.json" 2> "$dir/client.log" || rc=$?
  if (( rc == 2 )) && job_done "$dir/result.json" "$rid"; then
    # the job is done but its files could not be written here (a full disk): the rerun re-attaches
    # with the same request id and writes them, rather than proving it again
    echo "exit $rc (files not written)" > "$dir/.pending"
    echo "[pending] $name (proved, its files not written; a rerun writes them; see $dir/client.log)"
    return 0
  fi
  if (( rc == 1 || rc == 2 )); then  # the job failed (or its input is bad): a new attempt next time
    echo "exit $rc" > "$dir/.failed"
    echo "[FAILED] $name (exit $rc; see $dir/result.json and $dir/client.log)"
    return 0
  fi
  if (( rc != 0 )); then  # not waited for to its end (124, 3, 130, 143...): the rerun re-attaches
    echo "exit $rc" > "$dir/.pending"
    echo "[pending] $name (exit $rc; a rerun waits for the same job; see $dir/client.log)"
    return 0
  fi
  if (( BP_VERIFY )); then
    local pub vrc
    for pub in "$dir"/public_*.json; do
      vrc=0
      # proof_<i>.json beside public_<i>.json: the file name's prefix alone (the folders may hold "public_")
      "${cuzk[@]}" groth16 verify "$dir/verification_key.json" "$pub" \
          "$dir/proof_${pub##*/public_}" >> "$dir/client.log" 2>&1 || vrc=$?
      if (( vrc == 1 || vrc == 2 )); then
        echo "verify $pub" > "$dir/.failed"
        echo "[FAILED] $name (proof ${pub##*/} does not verify)"
        return 0
      elif (( vrc != 0 )); then  # the check was interrupted, not failed: the rerun checks again
        echo "verify exit $vrc" > "$dir/.pending"
        echo "[pending] $name (its check was interrupted)"
        return 0
      fi
    done
  fi
  touch "$dir/.done"
  echo "[ok] $name"
}
export -f prove_one

# Ctrl-C or SIGTERM: the jobs in flight stop waiting (they go on in the daemon), no more start, then the
# summary. The entries run in a process group of their own (set -m), to which this script passes the
# signal on: one sent to this script alone (`kill PID`) reaches them as a terminal's Ctrl-C does.
interrupted=0
set -m
( find "$input" -mindepth 1 -maxdepth 1 \( -type d -o -name '*.json' -o -name '*.wtns' \) -print0 \
    | sort -z | xargs -0 -r -n 1 -P "$jobs" bash -c 'prove_one "$1"' _ || true ) &
entries=$!
set +m
stop() { interrupted=1; kill -s "$1" -- "-$entries" 2> /dev/null || true; }
trap 'stop INT' INT
trap 'stop TERM' TERM
trap 'stop HUP' HUP  # the terminal closed: its hang-up no longer reaches the entries' group by itself
while ! wait "$entries"; do  # a signal ends the wait early: wait again until the entries have stopped
  kill -0 "$entries" 2> /dev/null || break
done
while kill -0 -- "-$entries" 2> /dev/null; do  # the entries of a group whose xargs a signal ended: their
  sleep 0.1                                    # markers are written before the summary counts them
done

total=0; done_n=0; failed=()
while IFS= read -r -d '' entry; do
  base=$(basename "$entry"); name="${base%.*}"; [[ -d "$entry" ]] && name="$base"
  total=$((total + 1))
  if [[ -f "$out/$name/.done" ]]; then done_n=$((done_n + 1)); else failed+=("$name"); fi
done < <(find "$input" -mindepth 1 -maxdepth 1 \( -type d -o -name '*.json' -o -name '*.wtns' \) -print0 | sort -z)
echo "batch-prove.sh: $done_n of $total jobs done${failed:+; not done: ${failed[*]}}"
if (( interrupted )); then
  echo "batch-prove.sh: interrupted; the same command resumes (jobs the daemon took are re-attached, not proved again)"
  exit 130
fi
(( ${#failed[@]} == 0 ))
