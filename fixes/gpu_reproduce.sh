# Sourced by fixes/<root-cause>/gpu.sh, which sets RELEASE, PATCH, CHECK, REPOS, ENV, ARGV and
# requests(). Runs `vllm serve ARGV` twice on this machine's vLLM RELEASE: as installed, then with
# PATCH applied to a hard-linked copy of the package (first on PYTHONPATH). Each run waits for the
# server, sends the witness's requests, and stops it; every process loads fixes/gpu_observe.py,
# which counts the CUDA graphs captured and replayed and, per runtime mode, the forwards no graph
# served. CHECK (fix.json "gpu") says what shows the bug unpatched and its absence patched; the
# script exits 0 when both hold. --dummy: random weights from the stored config.json (REPOS), no
# download and no tokenizer, for a machine without network (start-up bugs only).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
FIXES=$(dirname "$HERE")
PY=${PYTHON:-python3}
PORT=8000
TIMEOUT=1800  # a server's start-up, compile and capture on one GPU, and its requests
DUMMY=0; [ "${1:-}" = "--dummy" ] && DUMMY=1
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
have=$("$PY" -c 'import vllm; print(vllm.__version__)' 2>/dev/null)
[ "$have" = "$RELEASE" ] || { echo "needs vllm==$RELEASE in $PY (found: ${have:-none})" >&2; exit 2; }
SITE=$("$PY" -c 'import os, vllm; print(os.path.dirname(os.path.dirname(vllm.__file__)))')
mkdir -p "$WORK/observe" "$WORK/patched"
cp "$FIXES/gpu_observe.py" "$WORK/observe/gpu_observe.py"
echo "import gpu_observe" > "$WORK/observe/sitecustomize.py"
cp -al "$SITE/vllm" "$WORK/patched/vllm"
for f in $(sed -n 's#^+++ b/\([^\t]*\).*#\1#p' "$HERE/$PATCH"); do
  cp --remove-destination "$SITE/$f" "$WORK/patched/$f"
done
(cd "$WORK/patched" && patch -p1 -s --no-backup-if-mismatch < "$HERE/$PATCH") || { echo "$PATCH does not apply" >&2; exit 2; }
EXTRA=()
if [ "$DUMMY" = 1 ]; then
  for repo in "${REPOS[@]}"; do
    snap="$WORK/hf/hub/models--${repo//\//--}"
    mkdir -p "$snap/snapshots/0000000000000000000000000000000000000000" "$snap/refs"
    printf 0000000000000000000000000000000000000000 > "$snap/refs/main"
    cp "$FIXES/../contract/evidence/hf_configs/$repo/config.json" "$snap/snapshots/0000000000000000000000000000000000000000/"
  done
  export HF_HOME="$WORK/hf" HF_HUB_OFFLINE=1
  EXTRA=(--load-format dummy --skip-tokenizer-init)
fi

serve() {  # serve LABEL PYTHONPATH: start, wait, send the requests, stop; the log in $WORK/LABEL.log
  local label=$1 path=$2
  env PYTHONPATH="$path" VLLM_LOGGING_LEVEL=DEBUG "${ENV[@]}" \
    timeout "$TIMEOUT" "$PY" -m vllm.entrypoints.cli.main serve "${ARGV[@]}" --port "$PORT" "${EXTRA[@]}" \
    > "$WORK/$label.log" 2>&1 &
  local pid=$! up=0
  for _ in $(seq "$TIMEOUT"); do
    curl -sf "localhost:$PORT/health" > /dev/null 2>&1 && { up=1; break; }
    kill -0 $pid 2>/dev/null || break
    sleep 1
  done
  if [ $up = 1 ]; then
    requests
    echo "cudagraph-contract: the server answered" >> "$WORK/$label.log"
  fi
  kill -INT $pid 2>/dev/null; wait $pid 2>/dev/null
  echo "== $label: $(grep -c . "$WORK/$label.log") log lines"
}

serve unpatched "$WORK/observe"
serve patched "$WORK/observe:$WORK/patched"
"$PY" - "$WORK/unpatched.log" "$WORK/patched.log" "$CHECK" <<'EOF'
import json, re, sys
logs = [open(p, errors="replace").read() for p in sys.argv[1:3]]
check = json.loads(sys.argv[3])

def counts(text):
    out = {}
    for line in re.findall(r"^cudagraph-contract-observe (\{.*\})$", text, re.M):
        for k, v in json.loads(line).items():
            out[k] = out.get(k, 0) + v
    return out

before, after = map(counts, logs)
answered = ["cudagraph-contract: the server answered" in t for t in logs]
print("unpatched:", before)
print("patched:  ", after)
if "crash" in check:
    shown = bool(re.search(check["crash"], logs[0])) and not re.search(check["crash"], logs[1]) and answered[1]
elif "eager" in check:
    key = check["eager"] + " forwards no graph served"
    shown = before.get(key, 0) > 0 and after.get(key, 0) == 0 and answered[1]
elif "refused" in check:
    shown = answered[0] and bool(re.search(check["refused"], logs[1]))
else:
    shown = after.get("graphs captured", 0) < before.get("graphs captured", 0) and answered[1]
print("the bug shows on vLLM unpatched and is gone with the patch" if shown else "NOT SHOWN: read the two logs")
sys.exit(0 if shown else 1)
EOF
