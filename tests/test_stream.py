"""A seed replays the same examples whatever the process has imported: Hypothesis's constants mined
from local modules do not reach the stream (``contract.core.stream``)."""

import importlib.util
import os
import subprocess
import sys

from hypothesis import settings

from contract.core import profiles
from contract.core.machine import run_machine
from contract.families import load_policy
from contract.core.stream import CI_SEED, pinned_stream, seed_for

SMALL = settings(profiles.get("ci"), max_examples=40)


# Seeds whose unpinned stream takes a mined constant in one of Hypothesis's wide integer draws.
SEEDS = (1, 3, 8)


def _steps_drawn(policy) -> list:
    seen = []
    for seed in SEEDS:
        run_machine(policy, SMALL, seed=seed, on_step=lambda scenario, state, rec: seen.append((scenario, rec.event)))
    return seen


def _import_constants_module(tmp_path):
    """A local module full of integer constants, as a test module or a policy file would bring
    (Hypothesis mines integers outside (-100, 100); its own wide draws span 0..254)."""
    path = tmp_path / "many_constants.py"
    path.write_text("VALUES = [" + ", ".join(str(n) for n in range(100, 255)) + "]\n")
    spec = importlib.util.spec_from_file_location("_contract_test_many_constants", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[spec.name] = module
    return spec.name


def test_imported_modules_do_not_change_the_stream(tmp_path):
    policy = load_policy("vllm_0_30")
    before = _steps_drawn(policy)
    name = _import_constants_module(tmp_path)
    try:
        after = _steps_drawn(policy)
    finally:
        del sys.modules[name]
    assert before and before == after


def test_pinning_is_undone_after_the_run():
    from hypothesis.internal.conjecture import providers

    hook = providers._get_local_constants
    with pinned_stream():
        assert providers._get_local_constants is not hook
        assert len(providers._get_local_constants()) == 0
    assert providers._get_local_constants is hook


def test_a_derandomised_profile_runs_the_ci_seed():
    assert seed_for(profiles.get("ci"), None) == CI_SEED
    assert seed_for(profiles.get("ci"), 7) == 7
    assert seed_for(profiles.get("dev"), None) is None


def test_profiles_do_not_follow_the_ci_environment_variable():
    """Hypothesis loads its derandomised built-in profile when ``CI`` is set; the tool's profiles
    must mean the same on a CI machine as on a laptop."""
    probe = "from contract.core import profiles; print([profiles.get(n).derandomize for n in ('ci', 'dev', 'thorough')])"
    for env in ({"CI": "true"}, {}):
        out = subprocess.run(
            [sys.executable, "-c", probe],
            env={k: v for k, v in os.environ.items() if k != "CI"} | env,
            capture_output=True, text=True, check=True,
        ).stdout.strip()
        assert out == "[True, False, False]", (env, out)
