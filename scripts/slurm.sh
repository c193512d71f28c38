#!/usr/bin/env bash
# A ringfeed run across a Slurm allocation: stager, local producers and trainer on the
# first node; one producer pool per other node, connected to the first node over tcp
# with CURVE keys made for this job. Submit it, or run it inside an allocation:
#
#   sbatch --nodes=3 --cpus-per-task=8 scripts/slurm.sh CONFIG [--port P] [--consumer drain]
#   salloc --nodes=3 scripts/slurm.sh CONFIG
#
# Needs a shared file system between the nodes (the job directory holds the keys and
# the two derived configs) and ringfeed installed at the same path on every node.
# A producer node that dies is not restarted (Slurm does not); its grants come back by
# lease and the run goes on with the others.
#
#   sbatch --nodes=2 scripts/slurm.sh CONFIG --workers [--trainer-port P]
#
# --workers: every node is a training worker instead (MultiWorkerMirroredStrategy),
# one task per node: its own stager, producers and trainer (`ringfeed run --worker
# K/N`, K = SLURM_PROCID), worker K serving shard K of the global plan; trainer K
# listens on P + K (default 23456 + K). Worker 0's checkpoints, on the shared file
# system, resume them all. A worker that fails ends the step (--kill-on-bad-exit).
#SBATCH --job-name=ringfeed
#SBATCH --ntasks-per-node=1
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${RINGFEED_PYTHON:-$ROOT/.venv/bin/python}

config=${1:?usage: slurm.sh CONFIG [--port P] [--consumer trainer|drain]}
shift
port="" consumer=trainer workers=0 trainer_port=23456
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port=$2; shift 2 ;;
    --consumer) consumer=$2; shift 2 ;;
    --workers) workers=1; shift ;;
    --trainer-port) trainer_port=$2; shift 2 ;;
    --worker-task)  # one task of --workers, on its node (srun runs this)
      exec "$PY" -m ringfeed.scripts.cli run "$config" --run-id "$3" --worker "$SLURM_PROCID/$2" \
        --cluster "$4" ;;
    *) echo "slurm.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
: "${SLURM_JOB_ID:?slurm.sh runs inside a Slurm job (sbatch or salloc)}"
: "${SLURM_JOB_NODELIST:?no SLURM_JOB_NODELIST: run it under sbatch or salloc}"

mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
head=${nodes[0]}
others=$(( ${#nodes[@]} - 1 ))
run_id="slurm-$SLURM_JOB_ID"
config=$(cd "$(dirname "$config")" && pwd)/$(basename "$config")
if [ "$workers" = 1 ]; then
  cluster=""
  for k in "${!nodes[@]}"; do cluster+="${cluster:+,}${nodes[$k]}:$((trainer_port + k))"; done
  echo "slurm.sh: job $SLURM_JOB_ID, ${#nodes[@]} training workers ($cluster), run $run_id"
  exec srun --nodes="${#nodes[@]}" --ntasks-per-node=1 --kill-on-bad-exit=1 \
    "$ROOT/scripts/slurm.sh" "$config" --worker-task "${#nodes[@]}" "$run_id" "$cluster"
fi
job_dir="${SLURM_SUBMIT_DIR:-$PWD}/.ringfeed-slurm-$SLURM_JOB_ID"
mkdir -p -m 700 "$job_dir"

# Keys for this job: the head's pair, one client pair for every producer node.
"$PY" -m ringfeed.scripts.cli keys "$job_dir/keys" --client slurm >/dev/null

# Two configs derived from the user's: the head binds every interface (so it needs
# the keys), the producers use the client bundle. Everything else is the user's.
"$PY" - "$config" "$job_dir" "$port" <<'EOF'
import sys
from pathlib import Path

import yaml

from ringfeed.shared.config import read_raw

config, job_dir, port = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
raw = read_raw(config) or {}  # its data.path stays right from the job directory
transport = raw.get("transport", {}) | {"kind": "tcp", "host": "0.0.0.0"}
if port:
    transport["port"] = int(port)
for role, keys in (("head", job_dir / "keys"), ("producer", job_dir / "keys" / "for-slurm")):
    out = raw | {"transport": transport | {"keys_dir": str(keys)}}
    (job_dir / f"{role}.yaml").write_text(yaml.safe_dump(out, sort_keys=False))
EOF
port=$("$PY" -c "import sys; from ringfeed.shared.config import load_config; \
print(load_config(sys.argv[1]).transport.port)" "$job_dir/head.yaml")

echo "slurm.sh: job $SLURM_JOB_ID, head $head, $others producer node(s), run $run_id"
pids=()
if [ "$others" -gt 0 ]; then
  srun --nodes="$others" --ntasks-per-node=1 --exclude="$head" --kill-on-bad-exit=0 \
    "$PY" -m ringfeed.scripts.cli producers "$job_dir/producer.yaml" --run-id "$run_id" \
    --remote --connect "tcp://$head:$port" &
  pids+=($!)
fi
stop_producers() {
  # They may have ended already (the stager told them the run is over): never an error.
  if [ ${#pids[@]} -gt 0 ]; then kill -TERM "${pids[@]}" 2>/dev/null || true; fi
  wait || true
}
trap stop_producers EXIT

code=0
"$PY" -m ringfeed.scripts.cli run "$job_dir/head.yaml" --run-id "$run_id" --consumer "$consumer" || code=$?
echo "slurm.sh: run $run_id ended with code $code"
exit "$code"
