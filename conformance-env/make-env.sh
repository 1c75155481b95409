#!/usr/bin/env bash
# make-env.sh base DEST          the shared environment: torch==2.13.0, the pinned import closure
#                                (constraints.txt, --no-deps) and the project's CLI/test pins (TOOLS)
# make-env.sh VERSION DEST [BASE] one release: a venv without pip whose site-packages holds only
#                                vllm==VERSION (pip install --no-deps --target) and a .pth line that
#                                appends BASE's site-packages (default: DEST's folder/.venv-vllm)
#
# So every release shares one torch and one closure (about 1.2 GB) and adds only its own vLLM package;
# `DEST/bin/python` imports that release's vLLM first and everything else from BASE, and
# `BASE/bin/python` with PYTHONPATH=<a vLLM tree> runs a branch checkout over the same closure.
# The project's environments live at the repo root: .venv-vllm and .venv-vllm-<version> (gitignored).
# Idempotent: re-running skips every step whose result is already in place.
# On failure prints one line "make-env: error: ..." to stderr and exits 2.
#
# torch: `pip install torch==2.13.0` takes the local CPU wheel where pip is
# configured with find-links=/opt/wheels (this machine kind).  Elsewhere PyPI
# serves the CUDA build (502 MiB wheel plus nvidia/cuda-toolkit/triton wheels,
# several GB); it works on CPU too, only bigger and slower to install.
set -u -o pipefail

die() { echo "make-env: error: $*" >&2; exit 2; }

[ $# -eq 2 ] || [ $# -eq 3 ] || die "usage: make-env.sh base|VERSION DEST [BASE]"
VERSION=$1
DEST=$2
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd) || die "cannot locate script directory"
CONSTRAINTS="$HERE/constraints.txt"
[ -f "$CONSTRAINTS" ] || die "missing $CONSTRAINTS"
case "$VERSION" in
  base|[0-9]*.[0-9]*.[0-9]*) ;;
  *) die "VERSION must be 'base' or look like 0.30.0, got '$VERSION'" ;;
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
have() {  # have PYTHON DIST VERSION: installed at exactly that version (local tag ignored)
  "$1" - "$2" "$3" <<'EOF' 2>/dev/null
import sys, importlib.metadata as md
try:
    v = md.version(sys.argv[1])
except md.PackageNotFoundError:
    sys.exit(1)
sys.exit(0 if v.split("+")[0] == sys.argv[2] else 1)
EOF
}
site_packages() {
  "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null
}

t0=$(date +%s)

if [ "$VERSION" = base ]; then
  [ -x "$DEST/bin/python" ] || run "python3 -m venv $DEST" "$PY" -m venv "$DEST"
  PIP=("$DEST/bin/python" -m pip --disable-pip-version-check --no-cache-dir)
  have "$DEST/bin/python" torch 2.13.0 || run "pip install torch==2.13.0" "${PIP[@]}" install torch==2.13.0
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
  # The project's pins (pyproject.toml); their own dependencies resolve under the closure's pins.
  TOOLS="typer==0.29.2 rich==15.0.0 hypothesis==6.155.2 networkx==3.6.1 pytest==9.0.3"
  need=""
  for pin in $TOOLS; do
    have "$DEST/bin/python" "${pin%%==*}" "${pin##*==}" || need="$need $pin"
  done
  if [ -n "$need" ]; then
    # shellcheck disable=SC2086
    run "pip install$need" "${PIP[@]}" install -c "$CONSTRAINTS" $need
  fi
  run "import check" "$DEST/bin/python" -c 'import torch, transformers, typer, rich, hypothesis, networkx, pytest'
  rm -f "$LOG"
  echo "make-env: $DEST ready (shared closure, torch $("$DEST/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null)) in $(( $(date +%s) - t0 ))s"
  exit 0
fi

BASE=${3:-$(dirname "$DEST")/.venv-vllm}
[ -x "$BASE/bin/python" ] || die "no shared environment at $BASE (make it first: make-env.sh base $BASE)"
BASE=$(cd "$BASE" && pwd) || die "no folder $BASE"
BASE_SITE=$(site_packages "$BASE/bin/python") || die "cannot read $BASE's site-packages"
BASE_SITE=$(cd "$BASE_SITE" && pwd -P) || die "no folder $BASE_SITE"
BASE_EXE=$("$BASE/bin/python" -c 'import sys, os; print(os.path.realpath(sys.executable))') || die "cannot run $BASE/bin/python"
# The release venv runs the base's interpreter, so the closure's compiled wheels fit it.
[ -x "$DEST/bin/python" ] || run "python3 -m venv --without-pip $DEST" "$BASE_EXE" -m venv --without-pip "$DEST"
SITE=$(site_packages "$DEST/bin/python") || die "cannot read $DEST's site-packages"
echo "$BASE_SITE" > "$SITE/_vllm_shared_closure.pth"
if ! have "$DEST/bin/python" vllm "$VERSION"; then
  rm -rf "$SITE/vllm" "$SITE"/vllm-*.dist-info
  run "pip install --no-deps --target vllm==$VERSION" \
    "$BASE/bin/python" -m pip --disable-pip-version-check --no-cache-dir install --no-deps --no-compile \
    --upgrade --target "$SITE" "vllm==$VERSION"
fi

# smoke test: the release's vLLM comes from DEST, the closure from BASE, the version is right
run "import check" "$DEST/bin/python" - "$VERSION" "$SITE" "$BASE_SITE" <<'EOF'
import sys, os
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
import vllm, torch
assert vllm.__version__ == sys.argv[1], (vllm.__version__, sys.argv[1])
assert os.path.realpath(vllm.__file__).startswith(os.path.realpath(sys.argv[2])), vllm.__file__
assert os.path.realpath(torch.__file__).startswith(os.path.realpath(sys.argv[3])), torch.__file__
for m in ["vllm.config", "vllm.forward_context", "vllm.compilation.cuda_graph",
          "vllm.compilation.breakable_cudagraph", "vllm.compilation.backends",
          "vllm.compilation.decorators", "typer", "rich", "hypothesis", "networkx", "pytest"]:
    __import__(m)
print("ok", vllm.__version__, torch.__version__)
EOF
rm -f "$LOG"
echo "make-env: $DEST ready (vllm $VERSION over $BASE) in $(( $(date +%s) - t0 ))s"
