#!/usr/bin/env bash
# scripts/gpu-conformance.sh --pack
# scripts/gpu-conformance.sh [--device cuda|cpu-sim] [--out DIR] [--traces PATH]... [--corpus full|covering|none]
#
# --pack (on a machine with .venv-vllm-0.30.0): writes .gpu-bundle/site.tar.gz, the pinned vLLM
#   release's Python sources that the replay imports plus the pure-Python distributions of
#   conformance-env/constraints.txt (torch excluded) and the CLI's typer/rich, for a GPU machine
#   with torch but no network. Compiled distributions cannot be packed for another Python/torch;
#   they are listed in .gpu-bundle/manifest.json and the run checks they are importable.
# run: `cudagraph-contract conform --device DEVICE` on the default corpus (tests/traces plus the
#   covering generated set), with vLLM from the environment or else from the bundle, under a
#   7.5-minute limit. cuda writes reports/gpu/result.json and result.md; cpu-sim writes them to
#   --out or $OUT only, so a run without a GPU never writes GPU results.
# Python: $PYTHON, else python3. Exit 0 all agree, 1 disagreement, 2 problem (one line).
set -u -o pipefail
die() { echo "gpu-conformance: error: $*" >&2; exit 2; }
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) || die "cannot locate the repository"
BUNDLE="$ROOT/.gpu-bundle"
PY=${PYTHON:-python3}
DEVICE=cuda PACK=0 OUTDIR="${OUT:-}" CORPUS=covering TRACES=()
while [ $# -gt 0 ]; do
  case "$1" in
    --pack) PACK=1 ;;
    --device) DEVICE=${2:-}; shift ;;
    --out) OUTDIR=${2:-}; shift ;;
    --traces) TRACES+=(--traces "${2:-}"); shift ;;
    --corpus) CORPUS=${2:-}; shift ;;
    *) die "unknown argument '$1' (see the header of $0)" ;;
  esac
  shift
done

if [ "$PACK" = 1 ]; then
  VPY="$ROOT/.venv-vllm-0.30.0/bin/python"
  [ -x "$VPY" ] || die "no $ROOT/.venv-vllm-0.30.0 (conformance-env/make-env.sh 0.30.0 .venv-vllm-0.30.0)"
  mkdir -p "$BUNDLE" && cd "$ROOT" || die "cannot create $BUNDLE"
  PYTHONPATH="$ROOT" "$VPY" - "$BUNDLE" <<'EOF' || die "packing failed"
import importlib.metadata as md, json, sys, tarfile, re
from pathlib import Path
out = Path(sys.argv[1])
# vLLM's modules the replay imports: start a session and replay the regression traces once.
from contract.conformance.replay import Session
from contract.conformance.compare import compare
from contract.conformance.installed import installed_version, policy_for
from contract.policy import load_policy
from contract.trace import load
policy = load_policy(policy_for(installed_version()))
session = Session()
for p in sorted(Path("tests/traces").glob("*.json")):
    compare(session, load(p), policy, str(p))
import vllm
site = Path(vllm.__file__).parents[1]
files = {Path(m.__file__) for m in list(sys.modules.values())
         if getattr(m, "__file__", None) and m.__file__.endswith(".py") and Path(m.__file__).is_relative_to(site / "vllm")}
for sub in ("platforms", "compilation", "v1/worker", "v1/spec_decode"):  # the cuda path's other branches
    files |= set((site / "vllm" / sub).rglob("*.py"))
wanted = [re.split("[=<>]", l.strip())[0] for l in open("conformance-env/constraints.txt") if l.strip() and not l.startswith("#")]
wanted += ["typer", "click", "rich", "shellingham", "markdown-it-py", "mdurl", "Pygments", "vllm"]
pure, compiled = [], []
for name in wanted:
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    paths = [Path(dist.locate_file(f)) for f in dist.files or []]
    if name == "vllm":  # sources only, and dist-info for importlib.metadata.version("vllm")
        files |= {p for p in paths if ".dist-info" in str(p)}
        continue
    if any(p.suffix in (".so", ".pyd") for p in paths):
        compiled.append(name)
    else:
        pure.append(f"{name}=={dist.version}")
        files |= {p for p in paths if p.is_file() and p.suffix != ".pyc" and "__pycache__" not in p.parts}
with tarfile.open(out / "site.tar.gz", "w:gz") as tar:
    for p in sorted(files):
        tar.add(p, arcname=str(p.relative_to(site)))
json.dump({"vllm": vllm.__version__, "files": len(files), "pure": pure, "compiled_not_packed": compiled},
          open(out / "manifest.json", "w"), indent=1)
print(f"packed {len(files)} files, {(out / 'site.tar.gz').stat().st_size / 2**20:.1f} MiB: {out}/site.tar.gz")
print("compiled, must already be on the device machine: " + ", ".join(compiled))
EOF
  exit 0
fi

case "$DEVICE" in cuda|cpu-sim) ;; *) die "--device must be cuda or cpu-sim, got '$DEVICE'" ;; esac
case "$CORPUS" in full|covering|none) ;; *) die "--corpus must be full, covering or none" ;; esac
if [ "$DEVICE" = cuda ]; then
  OUTDIR="$ROOT/reports/gpu"
else
  [ -n "$OUTDIR" ] || die "--device cpu-sim writes to --out DIR or \$OUT, never to reports/gpu"
fi
mkdir -p "$OUTDIR" || die "cannot create $OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
WORK=$(mktemp -d) || die "mktemp failed"
trap 'rm -rf "$WORK"' EXIT
PYPATH="$ROOT"
if ! "$PY" -c "import vllm" >/dev/null 2>&1; then
  [ -f "$BUNDLE/site.tar.gz" ] || die "vLLM is not importable with $PY and there is no $BUNDLE/site.tar.gz (run $0 --pack where .venv-vllm-0.30.0 exists)"
  mkdir -p "$WORK/site" && tar xzf "$BUNDLE/site.tar.gz" -C "$WORK/site" || die "cannot unpack the bundle"
  PYPATH="$ROOT:$WORK/site"
fi
if [ "$DEVICE" = cuda ]; then  # one line rather than a traceback when there is no CUDA
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
    || die "--device cuda: torch.cuda.is_available() is False on this machine; use --device cpu-sim"
fi
[ ${#TRACES[@]} -gt 0 ] || TRACES=(--traces "$ROOT/tests/traces")
T0=$(date +%s)
PYTHONPATH="$PYPATH" timeout 450 "$PY" -m contract.cli conform --vllm auto --device "$DEVICE" --json \
  --corpus "$CORPUS" "${TRACES[@]}" --reports "$WORK/reports" >"$WORK/summary.json" 2>"$WORK/stderr"
RC=$?
T1=$(date +%s)
if [ ! -s "$WORK/summary.json" ]; then
  tail -n 1 "$WORK/stderr" >&2
  [ $RC -eq 124 ] && die "the conformance run passed its 450 s limit"
  exit $(( RC == 0 ? 2 : RC ))
fi
PYTHONPATH="$PYPATH" "$PY" - "$WORK/summary.json" "$OUTDIR" "$DEVICE" "$((T1 - T0))" "$CORPUS" <<'EOF' || die "cannot write the result"
import json, platform, sys
from pathlib import Path
summary, out, device, seconds, corpus = json.load(open(sys.argv[1])), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
import torch
machine = {"host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None}
summary.pop("report", None)
result = {"device": device, "machine": machine, "corpus": corpus, "seconds": seconds, **summary}
(out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
pct = "n/a" if summary["agreement"] is None else f"{100 * summary['agreement']:.2f}%"
lines = [f"# Conformance on {'real CUDA graphs' if device == 'cuda' else 'simulated CUDA graphs (cpu-sim)'}", "",
         f"- machine: {machine['gpu'] or 'no GPU'}; Python {machine['python']}, torch {machine['torch']}, "
         f"CUDA {machine['cuda']}, vLLM {summary['vllm']}",
         f"- corpus: {summary['trace_files']} trace files + {summary['generated_traces']} generated ({corpus})",
         f"- steps: {summary['agreeing_steps']} of {summary['steps']} agree ({pct}); "
         f"disagreeing traces: {summary['disagreeing_traces']}",
         f"- time: {seconds} s"]
if "device_checks" in summary:
    c = summary["device_checks"]
    lines.append(f"- CUDA: {c['graphs_captured']} graphs captured ({c['breakable_segments']} breakable segments, "
                 f"num_cudagraph_captured {c['num_cudagraph_captured']}); {c['replays_checked']} replays equal to eager "
                 f"(max relative error {c['max_rel_error']}); failures: {len(c['failures'])}")
    lines += [f"  - {f}" for f in c["failures"]]
(out / "result.md").write_text("\n".join(lines) + "\n")
print(f"{out}/result.json: {pct} of {summary['steps']} steps agree, {seconds} s")
EOF
exit $RC
