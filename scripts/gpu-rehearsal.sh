#!/usr/bin/env bash
# scripts/gpu-rehearsal.sh (make gpu-rehearsal): the GPU run rehearsed on a CPU machine.
#
# 1. a Python like the GPU machine's ($GPU_REHEARSAL_ENV, default .venv-gpu-rehearsal): Python 3.12
#    ($PYTHON312, default python3.12), torch 2.11.0 from the registry and
#    scripts/gpu-rehearsal-requirements.txt, then every distribution the machine does not list
#    (scripts/gpu-machine-packages.txt) removed; made once;
# 2. scripts/gpu-conformance.sh --pack from .venv-vllm-0.30.0 and .venv-vllm-0.34.0 (cp312 wheels);
# 3. the working tree and .gpu-bundle copied as they are carried, their size measured;
# 4. in that copy, scripts/gpu-conformance.sh --vllm $GPU_REHEARSAL_VLLM (default 0.30.0, Model
#    Runner V1; 0.34.0 replays Model Runner V2) --device cpu-sim with that Python, $OUT set, the
#    default corpus, and vLLM's import seeing a GPU host (tests/gpu_host: NVML finds a GPU, triton's
#    CUDA driver is active). Prints result.md and the wall time; exits with the script's status.
set -u -o pipefail
die() { echo "gpu-rehearsal: error: $*" >&2; exit 2; }
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) || die "cannot locate the repository"
ENV=${GPU_REHEARSAL_ENV:-$ROOT/.venv-gpu-rehearsal}
RELEASE=${GPU_REHEARSAL_VLLM:-0.30.0}
PY312=${PYTHON312:-python3.12}
if [ ! -x "$ENV/bin/python" ]; then
  "$PY312" -m venv "$ENV" || die "cannot make $ENV with $PY312 (set PYTHON312 to a Python 3.12)"
  "$ENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    -r "$ROOT/scripts/gpu-rehearsal-requirements.txt" || die "cannot install the GPU machine's packages"
  EXTRA=$("$ENV/bin/python" -I - "$ROOT/scripts/gpu-machine-packages.txt" <<'PY'
import importlib.metadata as md, re, sys
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
machine = {norm(l.strip()) for l in open(sys.argv[1]) if l.strip() and not l.startswith("#")}
print(" ".join(sorted({norm(d.metadata["Name"]) for d in md.distributions() if d.files} - machine)))
PY
  )
  [ -z "$EXTRA" ] || "$ENV/bin/python" -m pip uninstall --quiet -y $EXTRA || die "cannot remove $EXTRA"
fi
"$ENV/bin/python" -c "import sys, torch; print(f'rehearsal Python {sys.version.split()[0]}, torch {torch.__version__}')" \
  || die "$ENV has no working torch"
bash "$ROOT/scripts/gpu-conformance.sh" --pack || exit $?
WORK=$(mktemp -d) || die "mktemp failed"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/tree" && cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
  | xargs -0 -I{} cp --parents {} "$WORK/tree/" 2>/dev/null
cp -r "$ROOT/.gpu-bundle" "$WORK/tree/.gpu-bundle" || die "cannot copy the bundle"
echo "carried: $(du -sb "$WORK/tree" | awk '{printf "%.1f MiB", $1 / 1048576}') (working tree and .gpu-bundle)"
mkdir -p "$WORK/out"
T0=$(date +%s.%N)
cd "$WORK/tree" && env -u VIRTUAL_ENV PYTHON="$ENV/bin/python" PYTHONPATH="$ROOT/tests/gpu_host" OUT="$WORK/out" \
  bash scripts/gpu-conformance.sh --vllm "$RELEASE" --device cpu-sim
RC=$?
T1=$(date +%s.%N)
[ -f "$WORK/out/result.md" ] && cat "$WORK/out/result.md"
echo "rehearsal: exit $RC, $(echo "$T1 - $T0" | bc) s wall for the run"
exit $RC
