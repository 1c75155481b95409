"""The base cache trusts only what its parent wrote and watched, and a replay's vLLM code is the
release's own: ``contract/branch/cache.py`` and ``contract/real/provenance.py`` on files made here
(the end-to-end runs are ``tests/test_branch_review.py``'s)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

import pytest

from contract.branch import cache
from contract.real import installed, provenance


@pytest.fixture
def cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDAGRAPH_CONTRACT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / cache.FOLDER


def test_an_entry_comes_back_as_written(cache_folder):
    cache.store("k", "0.34.0", {"d": {"steps": []}}, {"p": {}})
    notes = cache.Notes()
    assert cache.load("k", notes) == {"vllm": "0.34.0", "observations": {"d": {"steps": []}}, "where": {"p": {}}}
    assert notes == []


def test_an_entry_changed_behind_the_tools_back_is_removed_and_said(cache_folder):
    cache.store("k", "0.34.0", {"d": {"steps": []}}, {})
    path = cache_folder / "k.json"
    data = json.loads(path.read_text())
    data["content"]["observations"]["d"] = {"steps": [{"forged": True}]}
    path.write_text(json.dumps(data))
    notes = cache.Notes()
    assert cache.load("k", notes) is None
    assert not path.exists() and len(notes) == 1 and "failed its check" in notes[0]


def test_a_missing_entry_is_no_note(cache_folder):
    notes = cache.Notes()
    assert cache.load("absent", notes) is None and notes == []


def test_what_named_code_changes_in_the_cache_is_removed_when_it_ends(cache_folder):
    cache.store("kept", "0.34.0", {}, {})
    cache.store("changed", "0.34.0", {}, {})
    notes = cache.Notes()
    with cache.guard(notes):
        content = (cache_folder / "changed.json").read_text()
        (cache_folder / "changed.json").write_text(content)  # the same bytes, written again
        (cache_folder / "new.json").write_text("{}")
    assert sorted(p.name for p in cache_folder.iterdir()) == ["kept.json"]
    assert len(notes) == 2 and all("changed while the tree's code ran" in n for n in notes)


def test_a_cache_folder_that_cannot_be_written_costs_time_not_the_result(tmp_path, monkeypatch, capsys):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("CUDAGRAPH_CONTRACT_CACHE", str(tmp_path / "a-file" / "cache"))
    installed.writable_cache_root.cache_clear()
    try:
        folder = installed.writable_cache_root()
        assert folder.is_dir() and os.access(folder, os.W_OK)
        assert installed.replay_settings()["CUDAGRAPH_CONTRACT_CACHE"] == str(folder)
        said = capsys.readouterr().err
        assert said.count("\n") == 1 and "cannot be written (Not a directory); this run uses a temporary one" in said
        cache.store("k", "0.34.0", {}, {})  # best effort: no error
    finally:
        installed.writable_cache_root.cache_clear()


# -- provenance -------------------------------------------------------------------------------------


def _sha(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@pytest.fixture
def release(tmp_path) -> Path:
    """A site folder holding a two-module ``vllm`` and its wheel's RECORD."""
    site = tmp_path / "site"
    files = {"vllm/__init__.py": b"", "vllm/config.py": b"X = 1\n", "vllm/_C.abi3.so": b"\x7fELF"}
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    record = site / "vllm-9.9.9.dist-info" / "RECORD"
    record.parent.mkdir()
    record.write_text("".join(f"{rel},sha256={_sha(data)},{len(data)}\n" for rel, data in files.items())
                      + "vllm-9.9.9.dist-info/RECORD,,\n")
    return site / "vllm"


def test_an_unedited_release_passes(release):
    provenance.check_installed(release, "9.9.9")
    provenance.check_loaded([["vllm", str(release / "__init__.py")], ["vllm.config", str(release / "config.py")],
                             ["vllm._C", str(release / "_C.abi3.so")]], release, "9.9.9")


def test_an_edited_environment_is_refused(release):
    (release / "config.py").write_text("X = 2\n")
    with pytest.raises(provenance.ProvenanceProblem, match="environment was edited: .*config.py is not the file"):
        provenance.check_installed(release, "9.9.9")


def test_a_module_from_elsewhere_is_refused(release, tmp_path):
    """What a caller's ``PYTHONPATH`` at a tree would do to the base side."""
    other = tmp_path / "tree" / "vllm" / "config.py"
    other.parent.mkdir(parents=True)
    other.write_text("X = 1\n")
    with pytest.raises(provenance.ProvenanceProblem, match="vllm.config ran from .*tree/vllm/config.py, not from"):
        provenance.check_loaded([["vllm.config", str(other)]], release, "9.9.9")


def test_a_tree_module_counts_only_where_the_child_took_it(release, tmp_path):
    tree = tmp_path / "tree" / "vllm"
    tree.mkdir(parents=True)
    (tree / "config.py").write_text("X = 3\n")
    modules = [["vllm.config", str(tree / "config.py")]]
    provenance.check_loaded(modules, release, "9.9.9", tree, ["vllm.config"])
    with pytest.raises(provenance.ProvenanceProblem):
        provenance.check_loaded(modules, release, "9.9.9", tree, [])


def test_an_edited_release_file_loaded_is_refused(release):
    (release / "config.py").write_text("X = 2\n")
    with pytest.raises(provenance.ProvenanceProblem, match="not the file vLLM 9.9.9's wheel installed"):
        provenance.check_loaded([["vllm.config", str(release / "config.py")]], release, "9.9.9")


def test_no_list_of_modules_is_refused(release):
    for modules in (None, [], [["vllm.config"]]):
        with pytest.raises(provenance.ProvenanceProblem):
            provenance.check_loaded(modules, release, "9.9.9")
