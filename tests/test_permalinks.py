"""Every permalink the pages cite exists in its release's source, and a range labelled with a
function's name starts at that function's ``def`` or first decorator
(``contract/evidence/permalinks.py``). A release whose source is not at hand is skipped, or fails
with ``CONTRACT_REQUIRE_VLLM=1``."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import pytest

from contract.evidence import permalinks, since

ROOT = Path(__file__).resolve().parents[1]


def _sources_or_skip(links):
    sources = since.sources(ROOT)
    missing = sorted({link.release for link in links} - set(sources))
    if missing:
        message = f"no source for vLLM {', '.join(missing)}: make .venv-vllm-<release> or set {since.ENV}"
        if os.environ.get("CONTRACT_REQUIRE_VLLM") == "1":
            pytest.fail(message)
    return sources, missing


def _problems(links, sources):
    found = defaultdict(list)
    for link in links:
        if link.release not in sources:
            continue
        why = permalinks.problem(link, sources[link.release])
        if why:
            found[(link.release, link.path, link.first, link.last, link.function)].append(f"{link.file}:{link.line}")
    return found


def _report(found) -> str:
    return "\n".join(f"v{r} {p}#L{a}-L{b} {('(' + f + ') ') if f else ''}- {len(where)} link(s), e.g. {where[0]}: "
                     f"{permalinks.problem(permalinks.Permalink('', 0, '', r, p, a, b, f), since.sources(ROOT)[r])}"
                     for (r, p, a, b, f), where in sorted(found.items()))


def test_pages_cite_permalinks():
    links = permalinks.collect(ROOT)
    assert len(links) > 100
    assert any(link.function for link in links)


def test_every_permalink_range_exists():
    links = [link for link in permalinks.collect(ROOT) if link.function is None]
    sources, missing = _sources_or_skip(links)
    if len(missing) == len({link.release for link in links}):
        pytest.skip("no release source at hand")
    found = _problems(links, sources)
    assert not found, "permalinks whose range does not exist:\n" + _report(found)


def test_function_labelled_permalinks_start_at_the_def():
    links = [link for link in permalinks.collect(ROOT) if link.function]
    sources, missing = _sources_or_skip(links)
    if len(missing) == len({link.release for link in links}):
        pytest.skip("no release source at hand")
    found = _problems(links, sources)
    assert not found, "permalinks labelled with a function that do not start at its def:\n" + _report(found)


def test_labels_are_read_as_the_page_writes_them():
    text = ("- `CudagraphDispatcher.dispatch` [`v1/cudagraph_dispatcher.py:235-324`]"
            "(https://github.com/vllm-project/vllm/blob/v0.30.0/vllm/v1/cudagraph_dispatcher.py#L235-L324)\n"
            "- `GPUModelRunner.load_model` (wrapping block) [`v1/worker/gpu_model_runner.py:5456-5495`]"
            "(https://github.com/vllm-project/vllm/blob/v0.30.0/vllm/v1/worker/gpu_model_runner.py#L5456-L5495)\n"
            "[`GPUModelRunner.profile_run`](https://github.com/vllm-project/vllm/blob/v0.30.0/vllm/v1/worker/gpu_model_runner.py#L6464-L6537)"
            " ([`_dummy_run`, lines 6204-6213 (the `use_cudagraphs` condition)]"
            "(https://github.com/vllm-project/vllm/blob/v0.30.0/vllm/v1/worker/gpu_model_runner.py#L6204-L6213))\n"
            "see https://github.com/vllm-project/vllm/blob/v0.30.0/vllm/forward_context.py#L268\n")
    got = [(link.function, link.first, link.last) for link in permalinks.parse(text)]
    assert got == [("CudagraphDispatcher.dispatch", 235, 324), (None, 5456, 5495),
                   ("GPUModelRunner.profile_run", 6464, 6537), (None, 6204, 6213), (None, 268, 268)]


def test_a_mid_body_function_label_is_found(tmp_path):
    package = tmp_path / "vllm"
    (package / "compilation").mkdir(parents=True)
    (package / "compilation" / "backends.py").write_text(
        "class VllmBackend:\n"
        "    @staticmethod\n"
        "    def helper():\n"
        "        pass\n"
        "\n"
        "    def __call__(self, graph):\n"
        "        x = 1\n"
        "        return x\n", encoding="utf-8")
    url = "https://github.com/vllm-project/vllm/blob/v0.30.0/vllm/compilation/backends.py"
    at_def, mid, decorated, past = permalinks.parse(
        f"- `VllmBackend.__call__` [`compilation/backends.py:6-8`]({url}#L6-L8)\n"
        f"- `VllmBackend.__call__` [`compilation/backends.py:7-7`]({url}#L7-L7)\n"
        f"[`VllmBackend.helper`]({url}#L2-L4)\n"
        f"[`compilation/backends.py:8-9`]({url}#L8-L9)\n")
    assert permalinks.problem(at_def, package) is None
    assert "starts inside it at line 7" in permalinks.problem(mid, package)
    assert permalinks.problem(decorated, package) is None
    assert "outside" in permalinks.problem(past, package)


def test_mirrored_statements_are_labelled_as_statements():
    """The four links the pages labelled as whole functions were mirrored statement groups
    (``decisions.Mirrored.location``): their label now says so."""
    from contract.evidence.decision_lines import Ran

    where = {"owner": "harness", "function": "SpecDecodeBaseProposer.propose",
             "path": "v1/spec_decode/llm_base_proposer.py", "lines": [574, 756]}
    text = "- " + Ran("propose: dispatch, forward", where, ("4",)).markdown("0.30.0")
    (link,) = permalinks.parse(text)
    assert "(mirrored statements)" in text and link.function is None and (link.first, link.last) == (574, 756)
    whole = "- " + Ran("SpecDecodeBaseProposer.dummy_run", {**where, "owner": "vLLM", "lines": [1627, 1680]},
                       ("3",)).markdown("0.30.0")
    assert permalinks.parse(whole)[0].function == "SpecDecodeBaseProposer.propose"
