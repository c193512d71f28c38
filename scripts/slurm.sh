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
#SBATCH --job-name=ringfeed
#SBATCH --ntasks-per-node=1
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${RINGFEED_PYTHON:-$ROOT/.venv/bin/python}

config=${1:?usage: slurm.sh CONFIG [--port P] [--consumer trainer|drain]}
shift
port="" consumer=trainer
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port=$2; shift 2 ;;
    --consumer) consumer=$2; shift 2 ;;
    *) echo "slurm.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
: "${SLURM_JOB_ID:?slurm.sh runs inside a Slurm job (sbatch or salloc)}"
: "${SLURM_JOB_NODELIST:?no SLURM_JOB_NODELIST: run it under sbatch or salloc}"

mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
head=${nodes[0]}
others=$(( ${#nodes[@]} - 1 ))
run_id="slurm-$SLURM_JOB_ID"
job_dir="${SLURM_SUBMIT_DIR:-$PWD}/.ringfeed-slurm-$SLURM_JOB_ID"
mkdir -p -m 700 "$job_dir"
config=$(cd "$(dirname "$config")" && pwd)/$(basename "$config")

# Keys for this job: the head's pair, one client pair for every producer node.
"$PY" -m scripts.cli keys "$job_dir/keys" --client slurm >/dev/null

# Two configs derived from the user's: the head binds every interface (so it needs
# the keys), the producers use the client bundle. Everything else is the user's.
"$PY" - "$config" "$job_dir" "$port" <<'EOF'
import sys
from pathlib import Path

import yaml

config, job_dir, port = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
raw = yaml.safe_load(config.read_text()) or {}
transport = raw.get("transport", {}) | {"kind": "tcp", "host": "0.0.0.0"}
if port:
    transport["port"] = int(port)
for role, keys in (("head", job_dir / "keys"), ("producer", job_dir / "keys" / "for-slurm")):
    out = raw | {"transport": transport | {"keys_dir": str(keys)}}
    (job_dir / f"{role}.yaml").write_text(yaml.safe_dump(out, sort_keys=False))
EOF
port=$("$PY" -c "import sys; from shared.config import load_config; \
print(load_config(sys.argv[1]).transport.port)" "$job_dir/head.yaml")

echo "slurm.sh: job $SLURM_JOB_ID, head $head, $others producer node(s), run $run_id"
pids=()
if [ "$others" -gt 0 ]; then
  srun --nodes="$others" --ntasks-per-node=1 --exclude="$head" --kill-on-bad-exit=0 \
    "$PY" -m scripts.cli producers "$job_dir/producer.yaml" --run-id "$run_id" \
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
"$PY" -m scripts.cli run "$job_dir/head.yaml" --run-id "$run_id" --consumer "$consumer" || code=$?
echo "slurm.sh: run $run_id ended with code $code"
exit "$code"
