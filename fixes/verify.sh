#!/bin/bash
# Reproduce the verdicts of fixes/<root-cause>/: its test on every installed release (compared with
# fix.json's "expected"), then every fixes/*/test_*.py on each release with each of its patches
# (and wrong fixes) applied, and last every test on each release with fixes/drop-every-graph's
# patch (resolve turns every mode into NONE), which each test must fail or skip.
#   fixes/verify.sh [ROOT_CAUSE_DIR ...]      (default: every folder with a fix.json)
# Needs the project's release environments (.venv-vllm, .venv-vllm-<release>) under $VENVS
# (default: this checkout). Patched trees are hard-linked copies of the release's vllm/ in a temp dir.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
VENVS=${VENVS:-$(dirname "$HERE")}
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
ALL_TESTS=$(ls "$HERE"/*/test_*.py)
export VLLM_LOGGING_LEVEL=ERROR

verdict() {  # pytest exit status -> pass/fail/skip (5: a module-level skip collects nothing)
  local out=$1 rc=$2
  if [ "$rc" -eq 5 ] && grep -q " skipped" <<<"$out"; then echo skip
  elif [ "$rc" -ne 0 ]; then echo fail
  elif grep -q " passed" <<<"$out"; then echo pass; else echo skip; fi
}

patched_verdicts() {  # RELEASE PATCH: "<root cause> pass/fail/skip" per test, on the patched release
  local rel=$1 patch=$2 tree=$TMP/tree site=$VENVS/.venv-vllm-$1/lib/python3.11/site-packages out t d lines
  rm -rf "$tree"; mkdir -p "$tree"
  cp -al "$site/vllm" "$tree/vllm"
  for f in $(sed -n 's#^+++ b/\([^\t]*\).*#\1#p' "$patch"); do cp --remove-destination "$site/$f" "$tree/$f"; done
  (cd "$tree" && patch -p1 -s --no-backup-if-mismatch < "$patch") || { echo "does not apply"; return; }
  # One process for all tests; per-folder verdicts from pytest's -rA summary.
  out=$(cd /tmp && PYTHONPATH=$tree "$VENVS/.venv-vllm/bin/python" -m pytest -q -p no:cacheprovider -rA $ALL_TESTS 2>&1)
  for t in $ALL_TESTS; do
    d=$(basename "$(dirname "$t")")
    lines=$(grep -E "^(PASSED|FAILED|ERROR|SKIPPED)( \[[0-9]+\])? [^ ]*/$d/" <<<"$out")
    if grep -qE "^(FAILED|ERROR)" <<<"$lines"; then echo "$d fail"; elif grep -q "^PASSED" <<<"$lines"; then echo "$d pass"
    else echo "$d skip"; fi
  done
}

for dir in ${@:-$(dirname $(ls "$HERE"/*/fix.json))}; do
  dir=$(cd "$dir" && pwd); rc_name=$(basename "$dir")
  json() { python3 -c "import json,sys; d=json.load(open('$dir/fix.json')); $1"; }
  test=$dir/$(json 'print(d["test"])')
  for rel in $(json 'print(" ".join(d["expected"]))'); do
    out=$(cd /tmp && "$VENVS/.venv-vllm-$rel/bin/python" -m pytest -q -p no:cacheprovider "$test" 2>&1); rc=$?
    got=$(verdict "$out" $rc); want=$(json "print(d['expected']['$rel'])")
    echo "$rc_name release $rel: $got (expected $want)$([ "$got" = "$want" ] || echo '  <-- MISMATCH')"
  done
  for kind in patches wrong_fixes; do
    for pair in $(json "print(' '.join(f'{r}={p}' for r, p in d.get('$kind', {}).items()))"); do
      rel=${pair%%=*}; patch=$dir/${pair#*=}
      patched_verdicts "$rel" "$patch" | sed "s#^#$rc_name $rel + $(basename "$patch"): #"
    done
  done
done

# A fix that drops every graph ends every graph violation: every test must fail on it (or skip).
for patch in "$HERE"/drop-every-graph/vllm-*.patch; do
  rel=$(basename "$patch" .patch); rel=${rel#vllm-}
  [ -x "$VENVS/.venv-vllm-$rel/bin/python" ] || continue
  patched_verdicts "$rel" "$patch" | sed -e "s#^#drop-every-graph $rel: #" -e "s#pass\$#pass  <-- NOT REJECTED#"
done
