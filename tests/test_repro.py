"""The ``vllm serve`` reproduction: no placeholders, flags vLLM's own parser accepts, and the log
lines vLLM itself prints for every MRV1 scenario class.

The facts committed in ``contract/evidence/release_facts.json`` are re-read from the installed
releases' source; the in-vLLM checks run in each release's venv and skip without it (fail with
``CONTRACT_REQUIRE_VLLM=1``).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from contract.evidence import logs, reach, serve
from contract.evidence.release_facts import committed, read
from contract.core.modes import AttentionCGSupport, CompilationMode
from contract.families import load_policy
from contract.core.scenario import DrafterKind, Scenario, SplittingOps
from contract.runners.mrv1.model.space import canonical_scenarios_of
from contract.core.trace import load
from vllm_envs import per_kind, release_source, require, run_env

ROOT = Path(__file__).resolve().parents[1]
FACTS = committed()
INSTALLED = serve.LOGS_CHECKED


def test_commands_name_real_things():
    for release in ("0.29.0", "0.30.0", "0.33.0"):
        for s in canonical_scenarios_of()[::7]:
            command, found = serve.command(s, FACTS[release]), reach.reach(s, release)
            assert (command is None) == (not found.reachable)
            if command is None:  # labelled instead, with the reason
                assert found.reason.startswith(("not reachable with the public models of", "no reproduction on")), found
                continue
            text = command.shell()
            assert not re.search(r"<[a-z]", text), text
            flags = text.split()
            if s.splitting_ops is SplittingOps.ATTENTION:
                assert "vllm::unified_attention_with_output" in text
            assert "--attention-backend" in flags
            assert (s.attention_support is AttentionCGSupport.NEVER) == (command.plan.model == reach.CHUNKED_LOCAL)


def test_default_path_is_shown_and_the_shortest_only_when_it_differs():
    p4 = load(ROOT / "reports" / "vllm_0_30" / "P4.json")  # skips profile_cudagraph_memory
    page = "\n".join(serve.markdown(p4, load_policy(p4.policy), FACTS["0.30.0"]))
    assert "--kv-cache-memory-bytes 2147483648" not in page and "default start-up path" in page
    assert serve.on_default_path(p4.events)[2].kind == "profile_cudagraph_memory"
    shortest = serve.command(p4.scenario, FACTS["0.30.0"], skip_memory_profile=True).argv
    assert shortest[-2:] == ("--kv-cache-memory-bytes", str(2 * 1024**3))
    p3 = load(ROOT / "reports" / "vllm_0_29" / "P3.json")  # already on the default path
    assert serve.default_path_fails(p3, load_policy(p3.policy)) is None


def test_backend_choice_follows_the_release_source():
    always = serve.backend_for("ALWAYS", FACTS["0.29.0"])
    assert always.choice.backend == "TRITON_ATTN" and not always.note
    single = serve.backend_for("UNIFORM_SINGLE_TOKEN_DECODE", FACTS["0.29.0"])
    assert single.choice.backend == "FLASHINFER" and "is_device_capability(90)" in single.note
    never = serve.backend_for("NEVER", FACTS["0.30.0"])
    assert never.choice is None and "no attention backend" in never.note


def test_resolve_log_lines_follow_the_branch_taken():
    s = Scenario(compilation_mode=CompilationMode.NONE, splitting_ops=SplittingOps.ATTENTION,
                 drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2,
                 attention_support=AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE)
    lines = logs.start_up_lines(s, "0.30.0", "FlashInferBackend")
    assert [x.site for x in lines] == ["normalise_without_piecewise", "resolve_spec_decode"]
    assert lines[-1].text.endswith("setting cudagraph_mode=PIECEWISE")
    assert [x.site for x in logs.start_up_lines(s, "0.29.0", "FlashInferBackend")] == ["normalise_none"]


@pytest.mark.conformance
@pytest.mark.parametrize("release", INSTALLED)
def test_committed_facts_match_the_installed_source(release):
    assert read(release, release_source(release)) == FACTS[release]


# In the release's venv: every canonical MRV1 scenario's command through vLLM's EngineArgs parser,
# and the cudagraph-mode lines vLLM logs while building its VllmConfig and resolving, against ours.
IN_VLLM = r"""
import dataclasses, json, logging, sys, typing
from contract.real import platform
from contract.runners.mrv1.real.replay import MODULES
platform.activate(MODULES)
import vllm.logger as vllm_logger
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.attention.backend import AttentionCGSupport
from vllm.config.speculative import SpeculativeConfig, SpeculativeMethod
import vllm.envs as envs
from contract.real.vllm_config import ConfigCache, config_key
from contract.evidence import logs, reach, serve
from contract.evidence.release_facts import committed
from contract.runners.mrv1.model.space import canonical_scenarios_of

release = sys.argv[1]
def methods(t):
    args = typing.get_args(t)
    return {m for a in args for m in (methods(a) if typing.get_args(a) else [a])}
facts = committed()[release]
records = []
class Keep(logging.Handler):
    def emit(self, record):
        text = record.getMessage()
        if "udagraph" in text or "CUDAGraphMode" in text or "splitting_ops" in text:
            records.append(f"{record.levelname} {text}")
root = logging.getLogger("vllm")
root.addHandler(Keep())
root.setLevel(logging.DEBUG)
parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
out = {"parse": [], "logs": [], "env": [n for n in ("VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_BREAKABLE_CUDAGRAPH")
                                        if n not in envs.environment_variables]}
config_logs, cache = {}, {}
for s in canonical_scenarios_of():
    command = serve.command(s, facts)
    if command is None:  # no stored checkpoint reaches it: the page says why instead
        continue
    argv = list(command.argv)
    try:
        # from_cli_args would fetch the model's config from the Hub: parsing is what checks the flags
        args = parser.parse_args(["--model", *argv])
        cc = args.compilation_config
        if str(cc.cudagraph_mode) != s.cudagraph_mode.name or cc.mode.name != s.compilation_mode.name:
            out["parse"].append([repr(s), f"parsed {cc.cudagraph_mode} {cc.mode.name}"])
        spec = args.speculative_config
        if spec is not None:
            unknown = set(spec) - {f.name for f in dataclasses.fields(SpeculativeConfig)}
            if unknown or spec["method"] not in methods(SpeculativeMethod):
                out["parse"].append([repr(s), f"speculative_config {sorted(unknown)} {spec['method']}"])
    except BaseException as exc:
        out["parse"].append([repr(s), f"{type(exc).__name__}: {exc}"])
    key = config_key(s)
    if key not in cache:
        vllm_logger._print_info_once.cache_clear(); vllm_logger._print_warning_once.cache_clear()
        records.clear()
        cache[key] = ConfigCache()
        try:
            cache[key].get(s)
        except Exception as exc:
            cache[key] = None
        config_logs[key] = list(records)
    if cache[key] is None:
        continue
    records.clear()
    config = cache[key].get(s)
    backend = serve.backend_class(s.attention_support.name, facts)
    try:
        config.compilation_config.resolve_cudagraph_mode_and_sizes(
            AttentionCGSupport[s.attention_support.name], backend, s.uniform_decode_query_len,
            use_v2_model_runner=False)
    except ValueError as exc:
        records.append(f"ERROR ValueError: {exc}")
    real = config_logs[key] + records
    ours = [f"{x.level} {x.text}" for x in logs.start_up_lines(s, release, backend)]
    if real != ours:
        out["logs"].append([repr(s), real, ours])
print(json.dumps(out))
"""


@pytest.mark.conformance
@pytest.mark.parametrize("release", per_kind(INSTALLED, set()))  # Model Runner V1: make evidence
def test_commands_parse_and_log_lines_match_vllm(release):
    python = require(release) / "bin" / "python"
    proc = subprocess.run([str(python), "-c", IN_VLLM, release], capture_output=True, text=True, timeout=900,
                          env=run_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["env"] == []
    assert out["parse"] == []
    assert out["logs"] == [], json.dumps(out["logs"][:3], indent=1)
