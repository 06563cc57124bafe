#!/usr/bin/env bash
# Prove a directory of inputs through a running cuzk-mp daemon, N jobs in flight, resumable.
#
#   scripts/batch-prove.sh --circuit ID --out OUT_DIR [--connect ADDR] [-j N] [--verify]
#                          [--priority P] [--timeout S] INPUT_DIR
#
# Each entry of INPUT_DIR is one job:
#   NAME.json / NAME.wtns   a job of one partition (circom input JSON, or a witness)
#   NAME/                   a job whose partitions are NAME/*.json|*.wtns in name order
# Results go to OUT_DIR/NAME/: proof_<i>.json, public_<i>.json, verification_key.json (snarkjs
# JSON), result.json (the job summary), client.log, and a .done marker once complete (and, with
# --verify, every proof verified by `cuzk-mp groth16 verify`).
#
# Resumable: entries with a .done marker are skipped. Each job's request id is
# batch-<circuit>-<NAME>-<attempt>, so rerunning after an interruption re-attaches to the job the
# daemon already has (no proof is computed twice); an entry whose job failed gets a new attempt.
# Exit 0 if every entry is done, 1 if any failed, 2 on bad arguments.
# $CUZK_MP overrides the command (default: cuzk-mp), e.g. CUZK_MP="python -m cuzk_mp.cli".
set -euo pipefail

connect="${CUZK_MP_CONNECT:-127.0.0.1:9820}"
jobs=4
verify=0
priority=""
timeout=""
circuit=""
out=""
input=""
usage() { sed -n '2,20p' "$0"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --circuit) circuit="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --connect) connect="$2"; shift 2 ;;
    -j|--jobs) jobs="$2"; shift 2 ;;
    --verify) verify=1; shift ;;
    --priority) priority="$2"; shift 2 ;;
    --timeout) timeout="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "batch-prove.sh: unknown option $1" >&2; exit 2 ;;
    *) [[ -z "$input" ]] || { echo "batch-prove.sh: one INPUT_DIR only" >&2; exit 2; }
       input="$1"; shift ;;
  esac
done
if [[ -z "$circuit" || -z "$out" || -z "$input" ]]; then
  usage >&2; exit 2
fi
[[ -d "$input" ]] || { echo "batch-prove.sh: $input is not a directory" >&2; exit 2; }
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "batch-prove.sh: -j needs a positive integer" >&2; exit 2; }
mkdir -p "$out"
export BP_CONNECT="$connect" BP_CIRCUIT="$circuit" BP_OUT="$out" BP_VERIFY="$verify" \
       BP_PRIORITY="$priority" BP_TIMEOUT="$timeout" BP_CUZK="${CUZK_MP:-cuzk-mp}"

# One job: prove an entry, write its files, verify, mark it done. Runs in a child bash.
prove_one() {
  local entry="$1" base name dir attempt rid rc
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
  echo "$attempt" > "$dir/.attempt"
  rid="batch-${BP_CIRCUIT}-$(echo "$name" | tr -c 'A-Za-z0-9_.\n-' '_' | cut -c1-80)-${attempt}"
  local -a files=("$entry") extra=()
  if [[ -d "$entry" ]]; then
    mapfile -t files < <(find "$entry" -maxdepth 1 -type f \( -name '*.json' -o -name '*.wtns' \) | sort)
  fi
  [[ -n "$BP_PRIORITY" ]] && extra+=(--priority "$BP_PRIORITY")
  [[ -n "$BP_TIMEOUT" ]] && extra+=(--timeout "$BP_TIMEOUT")
  rc=0
  "${cuzk[@]}" client prove --connect "$BP_CONNECT" --circuit "$BP_CIRCUIT" --out "$dir" \
      --request-id "$rid" "${extra[@]}" "${files[@]}" > "$dir/result.json" 2> "$dir/client.log" || rc=$?
  if (( rc != 0 )); then
    echo "exit $rc" > "$dir/.failed"
    echo "[FAILED] $name (exit $rc; see $dir/result.json and $dir/client.log)"
    return 0
  fi
  if (( BP_VERIFY )); then
    local pub
    for pub in "$dir"/public_*.json; do
      if ! "${cuzk[@]}" groth16 verify "$dir/verification_key.json" "$pub" \
           "${pub/public_/proof_}" >> "$dir/client.log" 2>&1; then
        echo "verify $pub" > "$dir/.failed"
        echo "[FAILED] $name (proof ${pub##*/} does not verify)"
        return 0
      fi
    done
  fi
  touch "$dir/.done"
  echo "[ok] $name"
}
export -f prove_one

find "$input" -mindepth 1 -maxdepth 1 \( -type d -o -name '*.json' -o -name '*.wtns' \) -print0 \
  | sort -z | xargs -0 -r -n 1 -P "$jobs" bash -c 'prove_one "$1"' _

total=0; done_n=0; failed=()
while IFS= read -r -d '' entry; do
  base=$(basename "$entry"); name="${base%.*}"; [[ -d "$entry" ]] && name="$base"
  total=$((total + 1))
  if [[ -f "$out/$name/.done" ]]; then done_n=$((done_n + 1)); else failed+=("$name"); fi
done < <(find "$input" -mindepth 1 -maxdepth 1 \( -type d -o -name '*.json' -o -name '*.wtns' \) -print0 | sort -z)
echo "batch-prove.sh: $done_n of $total jobs done${failed:+; failed: ${failed[*]}}"
(( ${#failed[@]} == 0 ))
