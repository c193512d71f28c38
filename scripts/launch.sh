#!/usr/bin/env bash
# Start, watch and stop a ringfeed run. Thin: every process is a `ringfeed` verb.
#
#   scripts/launch.sh                                  train on configs/demo.yaml
#   scripts/launch.sh run CONFIG [--run-id ID] [--consumer trainer|drain|none] [--inspect]
#                     [--trainer tf|torch|jax]   the model process: TensorFlow's, or an example
#                     [-- COMMAND...]  your own training command as the model process
#                     [--new-plan]     resume after the corpus, seed or buckets changed
#                     [--worker K/N --cluster HOST:PORT,...]   training worker K of N
#   scripts/launch.sh producers CONFIG --connect tcp://HEAD:PORT [--workers N]
#                                                      producers only (another host)
#   scripts/launch.sh inspect [--run-id ID]            attach the live inspector
#
# `run` is `ringfeed run` (scripts/runner.py): Ctrl-C or SIGTERM stops every
# process, SIGTERM first, SIGKILL after RINGFEED_GRACE_S (default 8) seconds,
# then any segment and socket file of the run is removed.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${RINGFEED_PYTHON:-$ROOT/.venv/bin/python}

abspath() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }

cmd_run() {
  local args=() run_id="" inspect=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --run-id|--consumer|--worker|--cluster|--trainer)
        [ $# -ge 2 ] || { echo "launch: run $1 needs a value" >&2; return 2; }
        if [ "$1" = --run-id ]; then run_id=$2; else args+=("$1" "$2"); fi
        shift 2 ;;
      --new-plan) args+=("$1"); shift ;;
      --inspect) inspect=1; shift ;;
      --) args+=("$@"); break ;;  # the model process's command, as it is
      -*) echo "launch: run has no option $1 (it takes --run-id, --consumer, --trainer," \
            "--worker, --cluster, --new-plan, --inspect, -- COMMAND)" >&2; return 2 ;;
      *) args+=("$(abspath "$1")"); shift ;;
    esac
  done
  # No cd: runs/ and .cache/ land in the working directory
  # (docs/configuration.md#where-files-go).
  if [ "$inspect" = 0 ]; then
    exec "$PY" -m ringfeed.scripts.cli run ${run_id:+--run-id "$run_id"} "${args[@]}"
  fi
  run_id=${run_id:-$(date +%Y%m%d-%H%M%S)-$$}
  local ring_id=$run_id worker
  for ((k = 0; k < ${#args[@]}; k++)); do  # training worker K's run (and ring) is R-wK
    [ "${args[$k]}" = --worker ] && worker=${args[$((k + 1))]} && ring_id=$run_id-w${worker%%/*}
  done
  # The run logs to a file the inspector shows under its screen: a redraw every
  # second would otherwise wipe the log lines (the loss among them) off the terminal.
  local log_dir=${RINGFEED_RUNTIME_DIR:-/tmp}/ringfeed-$(id -u)
  mkdir -p -m 700 "$log_dir"
  local log=$log_dir/$ring_id.log
  "$PY" -m ringfeed.scripts.cli run --run-id "$run_id" "${args[@]}" >"$log" 2>&1 &
  local pid=$! ipid=""
  # Both run in the background, so a TERM or Ctrl-C reaches this trap at once (a
  # foreground child would hold it until the child ends) and stops the run its way.
  trap 'kill -TERM "$pid" $ipid 2>/dev/null' INT TERM
  echo "launch: run $run_id starting (its log: $log)"
  # The inspector attaches once the stager made its ring (an index or length table may
  # take a while first), or not at all if the run ended before.
  while kill -0 "$pid" 2>/dev/null && ! [ -e "/dev/shm/ringfeed-$(id -u)-$ring_id-samples" ]; do
    sleep 0.5
  done
  if kill -0 "$pid" 2>/dev/null; then
    "$PY" -m ringfeed.scripts.cli inspect --run-id "$ring_id" --log "$log" &
    ipid=$!
    wait "$ipid"
  fi
  local code
  while :; do  # a trapped signal interrupts wait: wait again until the run has ended
    wait "$pid"
    code=$?
    kill -0 "$pid" 2>/dev/null || break
  done
  echo "--- the run's log ($log), last lines:"
  tail -n 15 "$log"
  return $code
}

verb=${1:-run}
[ $# -gt 0 ] && shift
case "$verb" in
  run) cmd_run "$@" ;;
  producers)
    config=$(abspath "$1")
    shift
    exec "$PY" -m ringfeed.scripts.cli producers "$config" --run-id remote --remote "$@"
    ;;
  inspect) exec "$PY" -m ringfeed.scripts.cli inspect "$@" ;;
  -h|--help|help) sed -n '2,16p' "$0" ;;
  *) cmd_run "$verb" "$@" ;;
esac
