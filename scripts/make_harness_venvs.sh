#!/usr/bin/env bash
# Create the per-framework harness venvs under .venvs/<framework>, reproducibly, from the pinned
# lock files in harnesses/venv_locks/<framework>.txt.
#
#   scripts/make_harness_venvs.sh                 # every framework that has a lock file
#   scripts/make_harness_venvs.sh mem0            # just one (CI: the ones its tests need)
#   FORCE=1 scripts/make_harness_venvs.sh mem0    # rebuild even if the venv matches its lock
#   JOBS=1 scripts/make_harness_venvs.sh          # one at a time (default: all at once, logs in .venvs/)
#   LOCK_DIR=requirements/venvs scripts/make_harness_venvs.sh vllm_cpu   # the vLLM CPU venv (Makefile)
#
# Each lock file starts with header lines the script reads:
#   # python: <interpreter>      (python3.11; EverOS needs /root/.pyenv/versions/3.12.1/bin/python)
#   # pre: <pip requirement>      (optional; installed first, e.g. torch==2.13.0 so that no framework
#                                  ever resolves a CUDA torch; the CPU wheel lies in /opt/wheels)
#   # editable: <path>            (optional; `pip install --no-deps -e <path>` after the lock: the vLLM
#                                  venv runs this repository's own code against its pins)
#   # skip-check: <reason>        (optional; no `pip check`, e.g. a declared pin known to be too strict)
# then the full `pip freeze` of a working venv, installed with --no-deps (no resolver surprises).
# The pip cache is reused between runs. A venv is built in .venvs/.<fw>.tmp and renamed into
# place only when complete; a stamp with the lock's hash lets a second run skip a current venv.
set -euo pipefail
cd "$(dirname "$0")/.."
LOCK_DIR=${LOCK_DIR:-harnesses/venv_locks}
VENVS=${HARNESS_VENV_ROOT:-.venvs}
mkdir -p "$VENVS"

frameworks=("$@")
if [ ${#frameworks[@]} -eq 0 ]; then
  for f in "$LOCK_DIR"/*.txt; do frameworks+=("$(basename "$f" .txt)"); done
fi

build_one() {
  local fw=$1 lock stamp py pre editable start tmp
  lock="$LOCK_DIR/$fw.txt"
  if [ ! -f "$lock" ]; then
    echo "make_harness_venvs: no lock file $lock for framework '$fw' (known: $(ls $LOCK_DIR | sed 's/.txt//' | tr '\n' ' '))" >&2
    return 2
  fi
  stamp="lock-$(sha1sum "$lock" | cut -c1-12)"
  if [ -z "${FORCE:-}" ] && [ -f "$VENVS/$fw/$stamp" ]; then
    echo "make_harness_venvs: $VENVS/$fw is current ($stamp)"
    return 0
  fi
  py=$(sed -n 's/^# python: *//p' "$lock" | head -1)
  pre=$(sed -n 's/^# pre: *//p' "$lock" | head -1)
  editable=$(sed -n 's/^# editable: *//p' "$lock" | head -1)
  if ! command -v "$py" >/dev/null 2>&1; then
    echo "make_harness_venvs: interpreter '$py' for $fw not found" >&2
    return 2
  fi
  start=$(date +%s)
  tmp="$VENVS/.$fw.tmp"
  rm -rf "$tmp"
  "$py" -m venv "$tmp"
  "$tmp/bin/python" -m pip install -q --upgrade pip
  # --no-compile: byte-compiling every installed file is most of an install's CPU time (torch +
  # transformers: 34 s vs 9 s here); Python compiles the modules a run imports, once, on first import
  # (unless PYTHONDONTWRITEBYTECODE is set: the Makefile unsets it for everything it runs)
  if [ -n "$pre" ]; then
    "$tmp/bin/python" -m pip install -q --no-compile "$pre"
  fi
  "$tmp/bin/python" -m pip install -q --no-compile --no-deps -r "$lock"
  if [ -n "$editable" ]; then
    "$tmp/bin/python" -m pip install -q --no-compile --no-deps -e "$editable"
  fi
  if ! grep -q '^# skip-check:' "$lock"; then
    "$tmp/bin/python" -m pip check
  fi
  touch "$tmp/$stamp"
  rm -rf "$VENVS/$fw"
  mv "$tmp" "$VENVS/$fw"
  # venv scripts hard-code their path; re-create the console entry points' shebangs after the move
  sed -i "1s|^#!.*/\.$fw\.tmp/bin/python.*|#!$(cd "$VENVS/$fw" && pwd)/bin/python|" "$VENVS/$fw"/bin/* 2>/dev/null || true
  echo "make_harness_venvs: $VENVS/$fw ready in $(( $(date +%s) - start )) s"
}

# The builds are mostly downloads and unpacking, so they overlap well (docs/log/findings.md, "CI time"):
# all at once by default, each with its own log; a failed one's log is printed whole.
if [ "${JOBS:-0}" = 1 ] || [ ${#frameworks[@]} -eq 1 ]; then
  for fw in "${frameworks[@]}"; do build_one "$fw"; done
  exit 0
fi
declare -A pids
for fw in "${frameworks[@]}"; do
  build_one "$fw" >"$VENVS/.$fw.log" 2>&1 &
  pids[$fw]=$!
done
failed=0
for fw in "${frameworks[@]}"; do
  if wait "${pids[$fw]}"; then
    tail -n 1 "$VENVS/.$fw.log"
  else
    echo "make_harness_venvs: $fw failed; its log ($VENVS/.$fw.log):" >&2
    cat "$VENVS/.$fw.log" >&2
    failed=1
  fi
done
exit $failed
