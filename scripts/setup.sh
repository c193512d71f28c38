#!/usr/bin/env bash
# Create .venv (if missing) and install ringfeed with its test tools into it. Idempotent.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
echo "setup: installing ringfeed into .venv (the first time downloads TensorFlow, ~600 MB)"
if ! .venv/bin/python -m pip install -e '.[dev,ray]' >.venv/setup.log 2>&1; then
  tail -n 30 .venv/setup.log >&2
  echo "setup: pip failed; the whole log is .venv/setup.log" >&2
  exit 1
fi
echo "setup: ok ($(.venv/bin/python --version))"
