#!/usr/bin/env bash
# Create .venv (if missing) and install ringfeed with its test tools into it. Idempotent.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-python3}
# espeak-ng: phonemes (text.tokens: phonemes) and the multilingual demo corpus's voices.
if ! command -v espeak-ng >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing espeak-ng (apt-get)"
    { apt-get update -qq && apt-get install -y -qq espeak-ng; } >/dev/null 2>&1 \
      || echo "setup: apt-get install espeak-ng failed; text.tokens: phonemes needs it" >&2
  else
    echo "setup: espeak-ng is missing (text.tokens: phonemes needs it): run" >&2
    echo "  sudo apt-get install -y espeak-ng" >&2
  fi
fi
# A C++ compiler: pyworld (features.pitch) has no binary wheel and builds from source.
if ! command -v g++ >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing a C++ compiler (apt-get build-essential) for pyworld"
    { apt-get update -qq && apt-get install -y -qq build-essential; } >/dev/null 2>&1 \
      || echo "setup: apt-get install build-essential failed; pip cannot build pyworld" >&2
  else
    echo "setup: no C++ compiler: pyworld (pitch) builds from source; run" >&2
    echo "  sudo apt-get install -y build-essential" >&2
  fi
fi
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
