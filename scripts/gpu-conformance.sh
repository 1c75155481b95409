#!/usr/bin/env bash
# scripts/gpu-conformance.sh --pack [--vllm VERSION]... [--bundle DIR]
# scripts/gpu-conformance.sh [--vllm VERSION] [--device cuda|cpu-sim] [--out DIR] [--bundle DIR] [--traces PATH]... [--corpus full|covering|none]
#
# --pack (where .venv-vllm-VERSION exists; default 0.30.0 and 0.34.0, Model Runner V1 and V2): writes
#   the folder to carry, .gpu-bundle/ (contract/gpu/bundle.py): vllm.tar.xz with every .py file
#   of each release's vLLM, site.tar.xz with the pure-Python distributions they share, wheels/
#   with the cp312 wheels of the compiled distributions the GPU machine lacks
#   (scripts/gpu-machine-packages.txt) for Python $GPU_PYTHON_VERSION (default 3.12, the GPU
#   machine's), manifest.json; prints its size with the working tree, and the MiB of the device
#   tool's 64 left to spare, and fails above 64 MiB.
# run: `cudagraph-contract conform --device DEVICE` on tests/traces, the traces under reports/ and the
#   covering generated set (or --traces/--corpus), with vLLM from the environment or else from the
#   bundle (--vllm VERSION picks the release, default the newest packed; its wheels are installed
#   into a scratch folder), stopped after $GPU_CONFORMANCE_LIMIT seconds (default 300, within a
#   360 s device call). The runner is the release's: MRV1 to 0.33, MRV2 from 0.34. Writes
#   result.json, result.md and the per-trace pages (traces/, conformance/, findings.md) into --out,
#   else $OUT, else (cuda only) reports/gpu; cpu-sim never writes to reports/gpu.
# Python: $PYTHON, else python3; the caller's PYTHONPATH is kept after the tree and the bundle.
# Exit 0 all agree, 1 disagreement, 2 problem (one line).
set -u -o pipefail
die() { echo "gpu-conformance: error: $*" >&2; exit 2; }
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) || die "cannot locate the repository"
BUNDLE="$ROOT/.gpu-bundle"
PY=${PYTHON:-python3}
LIMIT=${GPU_CONFORMANCE_LIMIT:-300}
DEVICE=cuda PACK=0 OUTDIR="${OUT:-}" CORPUS=covering TRACES=() VERSIONS=() PYVER=${GPU_PYTHON_VERSION:-3.12}
while [ $# -gt 0 ]; do
  case "$1" in
    --pack) PACK=1 ;;
    --vllm) VERSIONS+=("${2:-}"); shift ;;
    --bundle) BUNDLE=${2:-}; shift ;;
    --device) DEVICE=${2:-}; shift ;;
    --out) OUTDIR=${2:-}; shift ;;
    --traces) TRACES+=(--traces "${2:-}"); shift ;;
    --corpus) CORPUS=${2:-}; shift ;;
    *) die "unknown argument '$1' (see the header of $0)" ;;
  esac
  shift
done

if [ "$PACK" = 1 ]; then
  [ ${#VERSIONS[@]} -gt 0 ] || VERSIONS=(0.30.0 0.34.0)
  ADD=()
  for VERSION in "${VERSIONS[@]}"; do
    VPY="$ROOT/.venv-vllm-$VERSION/bin/python"
    [ -x "$VPY" ] || die "no $ROOT/.venv-vllm-$VERSION (cudagraph-contract env make $VERSION --dir .venv-vllm-$VERSION)"
    PYTHONPATH="$ROOT" "$VPY" -m contract.gpu.bundle --out "$BUNDLE" --python-version "$PYVER" \
      ${ADD[@]+"${ADD[@]}"} || die "packing vLLM $VERSION failed"
    ADD=(--add-release)
  done
  exit 0
fi
[ ${#VERSIONS[@]} -le 1 ] || die "--vllm names one release to run"
VERSION=${VERSIONS[0]:-}

case "$DEVICE" in cuda|cpu-sim) ;; *) die "--device must be cuda or cpu-sim, got '$DEVICE'" ;; esac
case "$CORPUS" in full|covering|none) ;; *) die "--corpus must be full, covering or none" ;; esac
if [ -z "$OUTDIR" ]; then
  [ "$DEVICE" = cuda ] || die "--device cpu-sim writes to --out DIR or \$OUT, never to reports/gpu"
  OUTDIR="$ROOT/reports/gpu"
fi
mkdir -p "$OUTDIR" || die "cannot create $OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
WORK=$(mktemp -d) || die "mktemp failed"
trap 'rm -rf "$WORK"' EXIT
PYPATH="$ROOT"
if ! "$PY" -c "import vllm" >/dev/null 2>&1; then
  [ -f "$BUNDLE/site.tar.xz" ] && [ -f "$BUNDLE/manifest.json" ] || die "vLLM is not importable with $PY and there is no $BUNDLE/site.tar.xz (run $0 --pack where the .venv-vllm-VERSION environments exist)"
  PACKED=$("$PY" -c 'import json, sys; print(" ".join(json.load(open(sys.argv[1]))["releases"]))' "$BUNDLE/manifest.json") \
    || die "cannot read $BUNDLE/manifest.json"
  if [ -z "$VERSION" ]; then  # the newest release packed
    VERSION=$(printf '%s\n' $PACKED | sort -V | tail -n 1)
  fi
  case " $PACKED " in *" $VERSION "*) ;; *) die "the bundle holds no vLLM ${VERSION:-release} (packed: $PACKED)" ;; esac
  PYTHONPATH="$ROOT" "$PY" -m contract.gpu.bundle --out "$BUNDLE" --unpack "$VERSION" --site "$WORK/site" \
    || die "cannot unpack the bundle"
  PYPATH="$ROOT:$WORK/site"
  if compgen -G "$BUNDLE/wheels/*.whl" >/dev/null; then
    "$PY" -m pip install --quiet --no-index --no-deps --no-compile --disable-pip-version-check \
      --target "$WORK/wheels" "$BUNDLE"/wheels/*.whl >"$WORK/pip.log" 2>&1 \
      || die "cannot install the bundle's wheels with $PY: $(tail -n 1 "$WORK/pip.log")"
    PYPATH="$PYPATH:$WORK/wheels"
  fi
fi
PYPATH="$PYPATH${PYTHONPATH:+:$PYTHONPATH}"
if [ "$DEVICE" = cuda ]; then  # one line rather than a traceback when there is no CUDA
  PYTHONPATH="$PYPATH" "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
    || die "--device cuda: torch.cuda.is_available() is False on this machine; use --device cpu-sim"
fi
T0=$(date +%s)
PYTHONPATH="$PYPATH" timeout "$LIMIT" "$PY" -m contract.cli conform --vllm auto --device "$DEVICE" --json \
  --corpus "$CORPUS" ${TRACES[@]+"${TRACES[@]}"} --reports "$WORK/reports" >"$WORK/summary.json" 2>"$WORK/stderr"
RC=$?
T1=$(date +%s)
if [ ! -s "$WORK/summary.json" ]; then
  tail -n 1 "$WORK/stderr" >&2
  [ $RC -eq 124 ] && die "the conformance run passed its $LIMIT s limit (GPU_CONFORMANCE_LIMIT; or --corpus none)"
  exit $(( RC == 0 ? 2 : RC ))
fi
PYTHONPATH="$PYPATH" "$PY" -m contract.gpu.gpu_result "$WORK/summary.json" "$WORK/reports" "$OUTDIR" \
  "$DEVICE" "$((T1 - T0))" || die "cannot write the result"
exit $RC
