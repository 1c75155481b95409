"""Bad input never gives a traceback; interrupted and concurrent runs never leave a half-written file;
the same seed gives the same bytes."""

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from contract import families as policy_module
from contract.core import child
from contract.cli import app
from contract.core.trace import TraceError, load

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()

JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 100), st.text(max_size=12),
                 st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))

# Every trace the project ships: the seeds of the fuzz.
SEEDS = sorted(p for p in [*(ROOT / "tests" / "traces").glob("*.json"), *(ROOT / "reports").glob("*/P*.json")])
SEED_TEXT = {p.name if p.parent.name == "traces" else f"{p.parent.name}/{p.name}": p.read_text() for p in SEEDS}
# A policy file whose import leaves a marker; the fuzz puts its path into traces, never on a command line.
EVIL = Path(tempfile.mkdtemp(prefix="cudagraph-contract-fuzz-")) / "evil.py"
EVIL.write_text(f"open({str(EVIL.with_suffix('.marker'))!r}, 'w').write('ran')\n"
                "from contract.runners.mrv1.model.policies.vllm_0_30 import load_model\n")
POLICY_NAMES = st.one_of(
    st.sampled_from([*policy_module.BUILT_IN, str(EVIL), EVIL.name, "evil.py", str(EVIL.parent), "vllm_0_31",
                     "VLLM_0_30", "vllm_0_30.py", "contract/runners/mrv1/model/policies/vllm_0_30.py", "x" * 300 + ".py",
                     "a\nb.py", "a\x00b.py", "../" * 40 + "evil.py", "/dev/null", "/proc/self/environ.py", ""]),
    st.text(max_size=30).map(lambda t: t + ".py"), st.text(max_size=30))


def _objects(data: dict) -> dict[str, dict]:
    """The JSON objects of a (possibly already mutated) trace that a mutation can reach."""
    events = data.get("events") if isinstance(data.get("events"), list) else []
    found = {"top": data, "scenario": data.get("scenario"), "expected": data.get("expected"),
             **{f"event {i}": e for i, e in enumerate(events)}}
    return {k: v for k, v in found.items() if isinstance(v, dict) and v}


def _structured(draw, data: dict) -> None:
    objects = _objects(data)
    events = [k for k in objects if k.startswith("event")]
    kind = draw(st.sampled_from(["schema version", "enum name", "missing field", "wrong type", "event field",
                                 "policy", "events reordered", "deep nesting", "big number", "grafted field"]))
    if kind == "schema version":
        data[draw(st.sampled_from(["schema", "version"]))] = draw(JUNK)
    elif kind == "enum name" and "scenario" in objects:
        field = draw(st.sampled_from(["runner", "cudagraph_mode", "compilation_mode", "splitting_ops",
                                      "drafter", "attention_support"]))
        objects["scenario"][field] = draw(st.text(max_size=20))
    elif kind == "missing field":
        target = objects[draw(st.sampled_from(sorted(objects)))]
        target.pop(draw(st.sampled_from(sorted(target))))
    elif kind == "wrong type":
        target = objects[draw(st.sampled_from(sorted(objects)))]
        target[draw(st.sampled_from(sorted(target)))] = draw(JUNK)
    elif kind in ("event field", "big number") and events:
        event = objects[draw(st.sampled_from(events))]
        if kind == "event field":
            event[draw(st.sampled_from(["event", "num_tokens", "uniform_decode", "force_eager", "x"]))] = draw(JUNK)
        else:
            event["num_tokens"] = draw(st.sampled_from([10**18, 2**63, -(2**63), 10**4000, 1e308, 0.5]))
    elif kind == "policy":
        data["policy"] = draw(POLICY_NAMES)
    elif kind == "events reordered" and isinstance(data.get("events"), list):
        data["events"] = draw(st.permutations(data["events"]))[: draw(st.integers(0, len(data["events"])))]
    elif kind == "deep nesting":
        value: object = draw(JUNK)
        for _ in range(draw(st.integers(1, 40))):
            value = draw(st.sampled_from([[value], {"k": value}]))
        data[draw(st.sampled_from(["origin", "name", "scenario", "events", "expected", "x"]))] = value
    elif kind == "grafted field":  # one field's value where another's belongs
        keys = sorted(data)
        data[draw(st.sampled_from(keys))] = data[draw(st.sampled_from(keys))]


@st.composite
def structured(draw) -> str:
    """A real trace with one or more of its fields mutated, as JSON text (or broken JSON text)."""
    text = SEED_TEXT[draw(st.sampled_from(sorted(SEED_TEXT)))]
    if draw(st.integers(0, 9)) == 0:
        return text[:draw(st.integers(0, len(text) - 1))]
    data = json.loads(text)
    for _ in range(draw(st.integers(1, 3))):
        _structured(draw, data)
    return json.dumps(data)


@st.composite
def byte_level(draw) -> bytes:
    """A real trace's bytes with bits flipped, ranges deleted, duplicated or overwritten, bytes inserted."""
    data = bytearray(SEED_TEXT[draw(st.sampled_from(sorted(SEED_TEXT)))].encode())
    for _ in range(draw(st.integers(1, 8))):
        i = draw(st.integers(0, len(data) - 1))
        j = min(len(data), i + draw(st.integers(1, 64)))
        op = draw(st.sampled_from(["flip", "delete", "insert", "duplicate", "overwrite"]))
        if op == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "delete":
            del data[i:j]
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=16))
        elif op == "duplicate":
            data[i:i] = data[i:j]
        else:
            data[i:j] = draw(st.sampled_from([b"{", b"}", b"[", b"]", b'"', b",", b":", b"null", b"-1", b"1e999",
                                               b'"x.py"', b"\\u0000", b"\xff"])) * (j - i)
        if not data:
            data = bytearray(b"{")
    return bytes(data)


def _no_file_import(*args, **kwargs):
    raise AssertionError("a trace made the policy loader run a file")


def _check_loaders(tmp_path_factory, payload: str | bytes) -> None:
    """The trace loader and the policy loader (as every command asks it for a trace's policy):
    a trace or a one-line error, never another exception, and no file imported. Then the same
    through `replay`: exit 0, 1 or 2 with one line on stderr, and the marker never written."""
    path = tmp_path_factory.mktemp("fuzz") / "t.json"
    (path.write_bytes if isinstance(payload, bytes) else path.write_text)(payload)
    try:
        trace = load(path)
    except TraceError as exc:
        assert "\n" not in str(exc)
    else:
        with mock.patch("contract.core.child.run", _no_file_import):
            try:
                policy_module.for_trace(trace.policy, str(path))
            except policy_module.PolicyError as exc:
                assert "\n" not in str(exc)
    result = runner.invoke(app, ["replay", str(path)])
    event(f"replay exit {result.exit_code}")
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    assert result.exit_code in (0, 1, 2), result.output
    if result.exit_code == 2:
        assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1, result.output
    assert not EVIL.with_suffix(".marker").exists(), "a trace ran the policy file it names"


FUZZ = dict(deadline=None, derandomize=True, database=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@settings(max_examples=200, **FUZZ)
@given(text=structured())
def test_fuzz_structured_mutations_of_real_traces(tmp_path_factory, text):
    _check_loaders(tmp_path_factory, text)


@settings(max_examples=200, **FUZZ)
@given(data=byte_level())
def test_fuzz_byte_mutations_of_real_traces(tmp_path_factory, data):
    _check_loaders(tmp_path_factory, data)


@settings(max_examples=100, **FUZZ)
@given(name=POLICY_NAMES, trust=st.booleans())
def test_fuzz_policy_names_in_traces(name, trust):
    """A trace's policy field, anything at all: only a built-in name loads without trust, and no
    file is imported; with trust, a name the file layer cannot use is a one-line error."""
    with mock.patch("contract.core.child.run", _no_file_import):
        try:
            policy = policy_module.for_trace(name, "t.json")
        except policy_module.PolicyError as exc:
            assert "\n" not in str(exc)
        else:
            assert name in policy_module.BUILT_IN and policy.source == "built-in"
    if trust and name != str(EVIL):
        try:
            policy_module.for_trace(name, "t.json", trust_files=True)
        except policy_module.PolicyError as exc:
            assert "\n" not in str(exc)


POLICY_SOURCE = (ROOT / "contract" / "runners" / "mrv1" / "model" / "policies" / "vllm_0_30.py").read_bytes()


@settings(max_examples=60, **FUZZ)
@given(data=st.data())
def test_fuzz_byte_mutations_of_a_policy_file(tmp_path_factory, data):
    """A policy file a person names, with bytes mutated: a policy or a one-line error."""
    source = bytearray(POLICY_SOURCE)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(source) - 1))
        op = data.draw(st.sampled_from(["flip", "delete", "insert"]))
        if op == "flip":
            source[i] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "delete":
            del source[i:i + data.draw(st.integers(1, 32))]
        else:
            source[i:i] = data.draw(st.sampled_from([b"(", b":", b"\n", b"\xff", b"import ", b"raise ", b"    "]))
    path = tmp_path_factory.mktemp("policy") / "mutated.py"
    path.write_bytes(bytes(source))
    with mock.patch.object(child, "time_limit", lambda: 5.0):
        try:
            policy = policy_module.load_policy(str(path))
        except policy_module.PolicyError as exc:
            assert "\n" not in str(exc)
        else:
            assert callable(policy.load_model)


def one_line_error(result, needle):
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], result.output


def test_policy_file_raising_at_import(tmp_path):
    bad = tmp_path / "raises.py"
    bad.write_text("raise SystemExit('no')\n")
    one_line_error(runner.invoke(app, ["verify", "--policy", str(bad)]), "failed to import: SystemExit: no")


def test_policy_file_looping_at_import(tmp_path):
    loop = tmp_path / "loops.py"
    loop.write_text("try:\n    while True:\n        pass\nexcept BaseException:\n    pass\n")
    started = time.monotonic()
    one_line_error(runner.invoke(app, ["verify", "--policy", str(loop), "--timeout", "1"]), "did not finish within 1 s")
    assert time.monotonic() - started < 10


def cli(*args):
    return [sys.executable, "-m", "contract.cli", *map(str, args)]


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_interrupted_report_leaves_the_previous_one(tmp_path):
    out = tmp_path / "reports"
    shutil.copytree(ROOT / "reports", out)
    before = snapshot(out)
    # A run started in the background of a non-interactive shell inherits SIGINT ignored, and Python
    # then installs no handler: give the child a terminal user's default disposition.
    child = subprocess.Popen(cli("report", "--out", out, "--quiet"), cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(4)
    # A KeyboardInterrupt raised inside a gc callback is printed and dropped by Python, so keep
    # pressing Ctrl-C as a user would until the run stops.
    deadline = time.monotonic() + 60
    while child.poll() is None and time.monotonic() < deadline:
        child.send_signal(signal.SIGINT)
        time.sleep(0.5)
    child.communicate(timeout=30)
    assert child.returncode != 0
    after = snapshot(out)
    assert set(after) == set(before), "files appeared or vanished"
    for name, data in after.items():
        assert data == before[name] or name.suffix != ".json" or load(out / name), name


def test_write_atomic_interrupted_keeps_the_old_file(tmp_path, monkeypatch):
    from contract.core import output

    target = tmp_path / "P1.json"
    target.write_text("old\n")

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(output.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        output.write_atomic(target, "new\n" * 1000)
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["P1.json"]


def test_same_seed_same_bytes():
    """``dev`` draws its examples from the seed (``ci`` is derandomized): the same seed, the same bytes."""
    runs = [subprocess.Popen(cli("verify", "--policy", "vllm_0_30", "--profile", "dev", "--seed", 7, "--json"), cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outputs = [r.communicate(timeout=120)[0] for r in runs]
    assert [r.returncode for r in runs] == [0, 0]  # every expected counterexample found under seed 7 too
    assert outputs[0] == outputs[1] and json.loads(outputs[0])


def test_concurrent_runs_into_one_folder(tmp_path):
    out = tmp_path / "out"
    runs = [subprocess.Popen(cli("explore", "--policy", "vllm_0_30", "--out", out, "--quiet"), cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    for r in runs:
        r.communicate(timeout=120)
    assert [r.returncode for r in runs] == [0, 0]
    files = sorted(out.iterdir())
    # one trace per failing property, then one per violation class; no temporary file left behind
    assert [p.name for p in files if p.name.count("-") == 1] == ["vllm_0_30-P0.json", "vllm_0_30-P1.json",
                                                                   "vllm_0_30-P10.json", "vllm_0_30-P4.json",
                                                                   "vllm_0_30-P7.json"]
    assert not [p.name for p in files if p.name.startswith(".")]
    for p in files:
        load(p)


def test_runs_into_sibling_folders_start_together(tmp_path):
    """Runs that share a parent folder start together (a test module's conform jobs do): checking
    an output folder must not create and remove the parent under the other run."""
    from concurrent.futures import ThreadPoolExecutor

    from contract.core.output import check_folder, write_atomic

    def run(i):
        for n in range(200):
            folder = tmp_path / f"shared-{n}" / f"run-{i}"
            check_folder(folder, "--reports")
            write_atomic(folder / "result.json", "{}")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(run, range(4)))
    assert sum(1 for _ in tmp_path.rglob("result.json")) == 800
