#!/usr/bin/env bash
# make-env.sh VERSION DEST
#
# Create (or complete) a CPU venv at DEST in which vLLM VERSION's real Python
# code for the CUDA-graph dispatch contract runs (see probe.py, FINDINGS.md):
#   torch==2.13.0, the pinned import closure (constraints.txt, --no-deps),
#   vllm==VERSION --no-deps, and the project's own CLI/test pins (TOOLS below) so that
#   `PYTHONPATH=<repo> DEST/bin/python -m contract.cli conform` and pytest run inside it.
# The project's venvs live at the repo root: .venv-vllm-0.30.0 and .venv-vllm-0.29.0 (gitignored).
# Idempotent: re-running skips every step whose result is already in place.
# On failure prints one line "make-env: error: ..." to stderr and exits 2.
#
# torch: `pip install torch==2.13.0` takes the local CPU wheel where pip is
# configured with find-links=/opt/wheels (this machine kind).  Elsewhere PyPI
# serves the CUDA build (502 MiB wheel plus nvidia/cuda-toolkit/triton wheels,
# several GB); it works on CPU too, only bigger and slower to install.
set -u -o pipefail

die() { echo "make-env: error: $*" >&2; exit 2; }

[ $# -eq 2 ] || die "usage: make-env.sh VERSION DEST"
VERSION=$1
DEST=$2
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd) || die "cannot locate script directory"
CONSTRAINTS="$HERE/constraints.txt"
[ -f "$CONSTRAINTS" ] || die "missing $CONSTRAINTS"
case "$VERSION" in
  [0-9]*.[0-9]*.[0-9]*) ;;
  *) die "VERSION must look like 0.30.0, got '$VERSION'" ;;
esac

PY=${PYTHON:-python3}
LOG=$(mktemp -t make-env.XXXXXX.log) || die "mktemp failed"
run() {  # run a step quietly; on failure die with one line (last error line of the log)
  local what=$1; shift
  if ! "$@" >>"$LOG" 2>&1; then
    local why
    why=$(grep -E '(^ERROR|Error|error:)' "$LOG" | tail -n 1)
    die "$what failed: ${why:-see log} (log: $LOG)"
  fi
}
have() {  # have DIST VERSION: installed at exactly that version (local tag ignored)
  "$DEST/bin/python" - "$1" "$2" <<'EOF' 2>/dev/null
import sys, importlib.metadata as md
try:
    v = md.version(sys.argv[1])
except md.PackageNotFoundError:
    sys.exit(1)
sys.exit(0 if v.split("+")[0] == sys.argv[2] else 1)
EOF
}

t0=$(date +%s)
if [ ! -x "$DEST/bin/python" ]; then
  run "python3 -m venv $DEST" "$PY" -m venv "$DEST"
fi
PIP=("$DEST/bin/python" -m pip --disable-pip-version-check)

have torch 2.13.0 || run "pip install torch==2.13.0" "${PIP[@]}" install torch==2.13.0

# closure: install only what is missing or at another version
missing=$("$DEST/bin/python" - "$CONSTRAINTS" <<'EOF'
import sys, importlib.metadata as md
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, ver = line.split("==")
    try:
        ok = md.version(name) == ver
    except md.PackageNotFoundError:
        ok = False
    if not ok:
        print(line)
EOF
) || die "cannot read $CONSTRAINTS with $DEST/bin/python"
if [ -n "$missing" ]; then
  run "pip install --no-deps -r constraints.txt" "${PIP[@]}" install --no-deps -r "$CONSTRAINTS"
fi

have vllm "$VERSION" || run "pip install vllm==$VERSION --no-deps" "${PIP[@]}" install --no-deps "vllm==$VERSION"

# The project's pins (pyproject.toml); their own dependencies resolve under the closure's pins.
TOOLS="typer==0.29.2 rich==15.0.0 hypothesis==6.155.2 networkx==3.6.1 pytest==9.0.3"
need=""
for pin in $TOOLS; do
  have "${pin%%==*}" "${pin##*==}" || need="$need $pin"
done
if [ -n "$need" ]; then
  # shellcheck disable=SC2086
  run "pip install$need" "${PIP[@]}" install -c "$CONSTRAINTS" $need
fi

# smoke test: the modules probe.py needs import, and the version is right
run "import check" "$DEST/bin/python" - "$VERSION" <<'EOF'
import sys, os
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
import vllm
assert vllm.__version__ == sys.argv[1], (vllm.__version__, sys.argv[1])
import torch
for m in ["vllm.config", "vllm.forward_context", "vllm.compilation.cuda_graph",
          "vllm.compilation.breakable_cudagraph", "vllm.compilation.backends",
          "vllm.compilation.decorators", "vllm.v1.cudagraph_dispatcher",
          "vllm.v1.worker.gpu_ubatch_wrapper", "vllm.v1.spec_decode.llm_base_proposer",
          "vllm.v1.worker.gpu_model_runner", "typer", "rich", "hypothesis", "networkx", "pytest"]:
    __import__(m)
print("ok", vllm.__version__, torch.__version__)
EOF
rm -f "$LOG"
echo "make-env: $DEST ready (vllm $VERSION, torch $("$DEST/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null)) in $(( $(date +%s) - t0 ))s"
