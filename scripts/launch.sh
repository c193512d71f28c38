#!/usr/bin/env bash
# Start, watch and stop a ringfeed run. Thin: every process is a `ringfeed` verb.
#
#   scripts/launch.sh                                  train on configs/demo.yaml
#   scripts/launch.sh run CONFIG [--run-id ID] [--consumer trainer|drain] [--inspect]
#   scripts/launch.sh producers CONFIG --connect tcp://HEAD:PORT [--workers N]
#                                                      producers only (another host)
#   scripts/launch.sh inspect [--run-id ID]            attach the live inspector
#
# Ctrl-C or SIGTERM stops every process: SIGTERM first, SIGKILL after
# RINGFEED_GRACE_S (default 8) seconds, then any segment of the run is removed.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${RINGFEED_PYTHON:-$ROOT/.venv/bin/python}
GRACE_S=${RINGFEED_GRACE_S:-8}
rf() { "$PY" -m scripts.cli "$@"; }

abspath() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }

pids=()
names=()
stopping=0

stop_all() {
  stopping=1
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  local waited=0
  while [ "$waited" -lt $((GRACE_S * 10)) ]; do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
    waited=$((waited + 1))
  done
  for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      echo "launch: pid $pid ignored SIGTERM for ${GRACE_S} s; killing it" >&2
      kill -KILL "$pid" 2>/dev/null
    fi
  done
}

# Wait for every child; stop the rest as soon as one fails, or GRACE_S after the stager
# (which ends the run) is gone. Exit 0 only if all exited 0.
watch_all() {
  local status=0 remaining=${#pids[@]} stager_gone=0 ticks=0
  while [ "$remaining" -gt 0 ]; do
    if [ "$stager_gone" = 1 ] && [ "$stopping" = 0 ]; then
      ticks=$((ticks + 1))
      [ "$ticks" -gt $((GRACE_S * 5)) ] && stop_all
    fi
    local i
    for i in "${!pids[@]}"; do
      local pid=${pids[$i]}
      [ -z "$pid" ] && continue
      if ! kill -0 "$pid" 2>/dev/null; then
        wait "$pid"
        local code=$?
        # A trapped signal interrupts `wait` with 128+n; bash kept the real status.
        [ "$code" -gt 128 ] && { wait "$pid"; code=$?; }
        pids[$i]=""
        remaining=$((remaining - 1))
        [ "${names[$i]}" = stager ] && stager_gone=1
        if [ "$code" != 0 ]; then
          echo "launch: ${names[$i]} exited with code $code" >&2
          status=$code
          [ "$stopping" = 0 ] && stop_all
        fi
      fi
    done
    sleep 0.2
  done
  return "$status"
}

start() {
  local name=$1
  shift
  "$PY" -m scripts.cli "$@" &  # not via rf(): a backgrounded function is a subshell
  pids+=($!)
  names+=("$name")
}

cmd_run() {
  local config="" run_id="" consumer="trainer" inspect=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --run-id) run_id=$2; shift 2 ;;
      --consumer) consumer=$2; shift 2 ;;
      --inspect) inspect=1; shift ;;
      *) config=$(abspath "$1"); shift ;;
    esac
  done
  config=${config:-$ROOT/configs/demo.yaml}
  run_id=${run_id:-$(date +%Y%m%d-%H%M%S)-$$}
  cd "$ROOT" || exit 1
  rf validate "$config" >/dev/null || exit 2
  trap 'echo "launch: stopping run $run_id" >&2; stop_all' INT TERM
  echo "launch: run $run_id with $config (inspect: scripts/launch.sh inspect --run-id $run_id)"
  start stager stager "$config" --run-id "$run_id"
  start producers producers "$config" --run-id "$run_id"
  start "$consumer" "$consumer" "$config" --run-id "$run_id"
  if [ "$inspect" = 1 ]; then
    sleep 2
    rf inspect --run-id "$run_id"
  fi
  watch_all
  local status=$?
  rf cleanup --run-id "$run_id" >/dev/null
  return "$status"
}

cmd_producers() {
  local config
  config=$(abspath "$1")
  shift
  cd "$ROOT" || exit 1
  trap 'stop_all' INT TERM
  start producers producers "$config" --run-id remote --remote "$@"
  watch_all
}

verb=${1:-run}
[ $# -gt 0 ] && shift
case "$verb" in
  run) cmd_run "$@" ;;
  producers) cmd_producers "$@" ;;
  inspect) cd "$ROOT" && exec "$PY" -m scripts.cli inspect "$@" ;;
  -h|--help|help) sed -n '2,12p' "$0" ;;
  *) cmd_run "$verb" "$@" ;;
esac
