"""Every decision point the harness mirrors is guarded against vLLM's source.

``decisions.MIRRORED`` names, for each harness function that mirrors vLLM lines, the statements it
mirrors and their ``ast`` digest per supported release. The digest is recomputed here from each
release's installed source (``.venv-vllm-<version>``; skipped without it, failed when
``CONTRACT_REQUIRE_VLLM=1``): a release whose statements changed fails until the mirror is
re-read and its digest recorded. The guard is shown to fail on a changed statement.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from contract.real.decisions import MIRRORED, Log, owner, share, tracked
from vllm_envs import release_source

ROOT = Path(__file__).resolve().parents[1]
# (mirrored point, release) for every release whose digest is recorded: MRV1's to 0.30.0, MRV2's
# (``runner="MRV2"``) for 0.33.0 and 0.34.0.
CASES = [(m, version) for m in MIRRORED for version in m.digests]


def _id(m) -> str:
    return f"{m.runner}:{m.point}:{m.method}"


@pytest.mark.parametrize(("mirrored", "version"), CASES,
                         ids=[f"{_id(m)}-{version}" for m, version in CASES])
def test_mirrored_statements_are_the_releases(mirrored, version):
    package = release_source(version)
    assert mirrored.nodes((package / mirrored.path).read_text(encoding="utf-8")), "mirrored statements not found"
    assert mirrored.digest(package) == mirrored.digests[version], (
        f"vLLM {version} changed what `{mirrored.point}` mirrors ({mirrored.class_name or '<module>'}.{mirrored.method} in "
        f"{mirrored.path}): re-read it, update the harness, then record the new digest"
    )


@pytest.mark.parametrize("mirrored", MIRRORED, ids=_id)
def test_guard_fails_when_a_mirrored_statement_changes(mirrored, tmp_path):
    """A renamed argument (keyword, or positional name) in one mirrored call changes the digest."""
    release = max(mirrored.digests)
    package = release_source(release)
    source = (package / mirrored.path).read_text(encoding="utf-8")
    call = next(n for node in mirrored.nodes(source) for n in ast.walk(node) if isinstance(n, ast.Call)
                and (n.keywords or any(isinstance(a, ast.Name) for a in n.args)))
    named = [k for k in call.keywords if k.arg] or [a for a in call.args if isinstance(a, ast.Name)]
    node = named[0]
    name = node.arg if isinstance(node, ast.keyword) else node.id
    lines = source.splitlines(keepends=True)
    line = lines[node.lineno - 1]
    at = line.index(name, node.col_offset)
    lines[node.lineno - 1] = line[:at] + name + "_changed" + line[at + len(name):]
    changed = tmp_path / mirrored.path
    changed.parent.mkdir(parents=True)
    changed.write_text("".join(lines), encoding="utf-8")
    assert mirrored.digest(tmp_path) != mirrored.digests[release]
    assert not mirrored.known(release, tmp_path)


def test_owner_is_read_from_where_the_code_lives(tmp_path):
    vllm_file = tmp_path / "vllm" / "v1" / "worker" / "m.py"
    vllm_file.parent.mkdir(parents=True)
    namespace: dict = {}
    exec(compile("def decide(x):\n    return x > 1\n", str(vllm_file), "exec"), namespace)
    assert owner(namespace["decide"]) == "vLLM"
    assert owner(test_owner_is_read_from_where_the_code_lives) == "harness"


def test_log_counts_each_point_once_per_step():
    import contract.real.decisions as decisions

    log = Log()
    decisions.LOG, saved = log, decisions.LOG
    try:
        mirror = tracked(lambda: None, "mirror")
        for _ in range(3):
            mirror()
        log.close_step("execute_model")
        log.note("dispatch", "vLLM")
        log.close_step("execute_model")
    finally:
        decisions.LOG = saved
    entries = log.to_json()
    assert {(e["point"], e["owner"], e["steps"]) for e in entries} == {("mirror", "harness", 1), ("dispatch", "vLLM", 1)}
    assert share(entries) == 0.5


def test_every_stand_in_is_documented_and_none_replaces_a_decision():
    from contract.runners.mrv1.real import gpu_model_runner as stand_in

    assert set(stand_in.STAND_INS) == set(stand_in.INFRASTRUCTURE)
    assert not set(stand_in.STAND_INS) & set(stand_in.ORCHESTRATION)


def test_every_mrv2_block_is_a_decision_point():
    """Each block the MRV2 replay cuts from ``model_runner.py`` is noted under its own point."""
    pytest.importorskip("torch")
    from contract.runners.mrv2.real import decision_points, model_runner

    assert set(decision_points.BLOCKS) == set(model_runner.Blocks.__dataclass_fields__)
