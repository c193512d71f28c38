#!/usr/bin/env bash
# Create .venv (if missing) and install ringfeed with its test tools into it. Idempotent.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-python3}
# need COMMAND PACKAGE WHY: apt-get install PACKAGE when COMMAND is missing (as root),
# else say what to run.
need() {
  command -v "$1" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing $2 (apt-get): $3"
    { apt-get update -qq && apt-get install -y -qq "$2"; } >/dev/null 2>&1 \
      || echo "setup: apt-get install $2 failed; $3" >&2
  else
    echo "setup: $1 is missing ($3): run" >&2
    echo "  sudo apt-get install -y $2" >&2
  fi
}
need espeak-ng espeak-ng "text.tokens: phonemes and the multilingual demo's voices need it"
need g++ build-essential "the row pass (shared/memory/_row_pass.c) is built from source, and pyworld (features.pitch)"
# The row pass is a C extension of the interpreter .venv is made with: it needs its headers.
PY_H=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h
[ -f "$PY_H" ] || need "$PY_H" python3-dev "the row pass (shared/memory/_row_pass.c) includes $PY_H"
[ -f "$PY_H" ] || echo "setup: $PY_H is missing: install the development headers of $PYTHON" \
  "(Debian's python3: python3-dev; a pyenv or conda Python ships them), or the build fails" >&2
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
echo "setup: installing ringfeed into .venv (the first time downloads TensorFlow, ~600 MB)"
# scripts/constraints.txt: the versions the suite last passed with (its header says why).
PIN=(-c scripts/constraints.txt)
if ! .venv/bin/python -m pip install "${PIN[@]}" -e '.[dev,ray,tf]' >.venv/setup.log 2>&1; then
  tail -n 30 .venv/setup.log >&2
  echo "setup: pip failed; the whole log is .venv/setup.log" >&2
  exit 1
fi
# The PyTorch and JAX model sides (docs/loaders.md), for their loaders' tests, where they
# can be reached; where not, those tests skip. torch is pinned to the CPU build this
# project's machines keep on disk: a plain `torch` takes a CUDA build of several GB.
optional() {
  echo "setup: installing $1" >>.venv/setup.log
  .venv/bin/python -m pip install "${PIN[@]}" "${@:2}" >>.venv/setup.log 2>&1 \
    || echo "setup: $1 not installed (.venv/setup.log says why): its tests skip" >&2
}
# Lightning: a client of ringfeed.torch in the tests (tests/unit/test_lightning_client.py),
# installed in the same call so that the resolver keeps that CPU build (~40 MB more).
optional "PyTorch (CPU) and Lightning" torch==2.13.0 -e '.[torch]' 'lightning>=2.2'
# Orbax: the JAX loader's cursor saved beside a model's state in its CheckpointManager
# (tests/unit/test_jax_loader.py).
optional "JAX and Orbax" -e '.[jax]' orbax-checkpoint
# numba caches what it compiles beside the modules: a run's stager then builds a balanced
# plan in about 0.5 s, not 15 s before its first grant (consumer/stager/plan/make.py).
echo "setup: compiling the balanced plan's kernels (once per install, ~15 s)"
.venv/bin/python -c "from ringfeed.consumer.stager.plan.make import compile_kernels; compile_kernels()"
# Where PYTHONDONTWRITEBYTECODE is set (these machines set it), every process would
# compile ringfeed from source at its start: ~0.25 s of CPU each, and a run starts
# several. Compiled once here, they read the .pyc (stale ones are recompiled in memory).
.venv/bin/python -m compileall -q shared producer consumer scripts tests benchmarks >/dev/null
echo "setup: ok ($(.venv/bin/python --version))"
