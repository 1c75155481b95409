"""Reproductions that reach the bug, without vLLM: every scenario setting maps to public flags and
stored checkpoints or is labelled unreachable with a reason; the model facts are read, not assumed;
the config comparison reports each setting that differs; the requests make the batch the witness
needs. The same commands run through vLLM's own parser and config in ``test_engine_check.py``."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import pytest

from contract.core.events import CaptureModel, LoadModel, ProfileRun, Propose, Resolve
from contract.evidence import engine_check, model_facts, reach, repro_check, requests, serve
from contract.evidence.release_facts import committed, hardware
from contract.core.modes import FULL, FULL_AND_PIECEWISE, AttentionCGSupport
from contract.core.scenario import DrafterKind, Runner, Scenario, Speculator
from contract.core.trace import Trace, load

ROOT = Path(__file__).resolve().parents[1]
FACTS = committed()
MTP_UNCOMPILED = Scenario(runner=Runner.MRV2, drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2,
                          draft_compiled=False)


def test_every_page_is_reproduced_or_labelled():
    pages = repro_check.pages(ROOT / "reports")
    assert len(pages) == len(list((ROOT / "reports").glob("*/classes/*.json"))) + len(list((ROOT / "reports").glob("*/P*.json"))) \
        + len(list((ROOT / "reports" / "root-causes").glob("*.md")))
    for page in pages:
        if not page.commands:
            assert page.reason.startswith(("not reachable with the public models of", "no reproduction on")) \
                or page.path.startswith("root-causes/") and page.reason.startswith("vLLM "), page
            continue
        for command in page.commands:
            plan = command.plan
            assert plan.release == page.release and plan.capabilities, page
            assert "--attention-backend" in command.argv and plan.model in command.argv


def test_uncompiled_draft_is_an_mtp_head_the_release_source_says_is_uncompiled():
    for release in ("0.33.0", "0.34.0"):
        found = reach.reach(MTP_UNCOMPILED, release)
        assert found.reachable, found.reason
        plan = found.plan
        assert plan.speculative["method"] == "mtp" and plan.model == "zai-org/GLM-4.5-Air"
        facts = model_facts.committed()[release]
        assert facts.draft("Glm4MoeMTPModel").status == model_facts.NOT_COMPILED
        assert facts.target("Glm4MoeForCausalLM").status == model_facts.COMPILED
        # the EAGLE-3 head the page used to name is compiled: it could not have reached the bug
        head = facts.draft(reach.checkpoints()[reach.EAGLE_HEAD].architecture)
        assert head.status == model_facts.COMPILED and "llama_eagle3.LlamaModel" in head.decorated[0]
        assert any("MTPSpeculator" in note for note in plan.notes)


def test_the_choice_follows_the_facts(monkeypatch):
    real = model_facts.committed()

    def flipped():
        out = {}
        for release, f in real.items():
            drafts = tuple(dataclasses.replace(m, status=model_facts.COMPILED) if m.arch == "Glm4MoeMTPModel" else m
                           for m in f.drafts)
            out[release] = dataclasses.replace(f, drafts=drafts)
        return out

    monkeypatch.setattr(model_facts, "committed", flipped)
    found = reach.reach(MTP_UNCOMPILED, "0.34.0")
    assert not found.reachable and "draft_compiled=False" in found.reason and "ErnieMTPModel" in found.reason


@pytest.mark.parametrize("scenario, release, says", [
    (Scenario(), "0.34.0", "not reachable with the public models of vLLM 0.34.0: Model Runner V1 is gone"),
    (Scenario(runner=Runner.MRV2, extensible_kv_cache=False), "0.33.0",
     "not reachable with the public models of vLLM 0.33.0: the extensible KV cache exists from 0.34.0"),
    (Scenario(attention_support=AttentionCGSupport.NEVER, drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2),
     "0.30.0", "no reproduction on vLLM 0.30.0 with the checkpoints this project stores: attention support NEVER"),
    (Scenario(runner=Runner.MRV2, model_compiled=False), "0.34.0", "model_compiled=False needs a target architecture"),
    (Scenario(runner=Runner.MRV2, drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=3,
              speculator=Speculator.MULTI_MODULE_MTP), "0.34.0", "multi-module MTP speculator"),
])
def test_unreachable_settings_say_why(scenario, release, says):
    found = reach.reach(scenario, release)
    assert not found.reachable and says in found.reason
    assert serve.command(scenario, FACTS[release]) is None
    trace = Trace(scenario, "mrv2_0_34", [LoadModel()], property=None)
    page = "\n".join(serve.markdown(trace, None, FACTS[release]))
    assert found.reason in page and "vllm serve" not in page


def test_support_levels_are_named_by_gpu():
    # FlashInfer with TRT-LLM attention off: single-token decode on every GPU in 0.29.0, from
    # Hopper on in 0.34.0 (below 9.0 its FA2 native decode takes uniform batches)
    assert reach.capabilities_for("UNIFORM_SINGLE_TOKEN_DECODE", "0.29.0") == engine_check.CAPABILITIES
    assert reach.capabilities_for("UNIFORM_SINGLE_TOKEN_DECODE", "0.34.0") == ("9.0", "10.0", "10.3", "12.0", "12.1")
    lines = hardware("0.34.0", "FLASHINFER")
    assert any("use_trtllm_attention" in line and "`UNIFORM_SINGLE_TOKEN_DECODE` on 9.0 and newer" in line for line in lines)
    assert any("`ALWAYS` on 9.0" in line for line in hardware("0.30.0", "FLASH_ATTN"))  # FA3 on Hopper
    s = Scenario(runner=Runner.MRV2, cudagraph_mode=FULL, drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2,
                 attention_support=AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE)
    text = "\n".join(serve.plan_lines(reach.reach(s, "0.34.0").plan))
    assert "compute capability 9.0 and newer (H100, H200, GH200;" in text and "A100" not in text


def test_requests_make_the_batch_the_witness_needs():
    p4 = load(ROOT / "reports" / "vllm_0_30" / "P4.json")  # propose(1) after start-up, q = 2
    found = requests.need(p4)
    assert found.requests == 1 and found.prompt_ids is None and found.max_tokens > 1
    assert "decode step of one request" in found.what and "padded to 2" in found.what
    page = "\n".join(requests.markdown(p4, "Qwen/Qwen3-8B"))
    assert "curl -s http://localhost:8000/v1/completions" in page and '"model": "Qwen/Qwen3-8B"' in page
    startup = load(ROOT / "reports" / "mrv2_0_34" / "P1.json")
    assert requests.need(startup) is None
    assert "no request is needed" in requests.markdown(startup, "x")[0]
    mrv2 = Scenario(runner=Runner.MRV2, drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2)
    uniform = Trace(mrv2, "mrv2_0_34", [LoadModel(), ProfileRun(), Resolve(), CaptureModel(), Propose(4, True)],
                    property="P1", expected_violations=[{"property": "P1", "step": 4, "message": "m"}])
    found = requests.need(uniform)
    assert found.requests == 2 and "uniform batch of 4 tokens" in found.what
    shell = requests.curl("m", found)
    assert shell.count("curl") == 1 and "seq 2" in shell and shell.endswith("wait")
    mixed = dataclasses.replace(uniform, events=[*uniform.events[:4], Propose(3)])
    found = requests.need(mixed)
    assert found.prompt_ids == 3 and json.loads(requests.curl("m", found).split("-d '")[1][:-1])["prompt"] == [100] * 3


def _observed(plan: reach.Plan) -> dict:
    """What vLLM would build for ``plan`` if the command reached its scenario."""
    from contract.core.scenario import post_init

    s = plan.scenario
    post = post_init(s, reach.revision(plan.release))
    spec = None
    if s.drafter is not DrafterKind.NONE:
        spec = {"method": plan.speculative["method"], "num_speculative_tokens": s.uniform_decode_query_len - 1,
                "enforce_eager": s.spec_enforce_eager, "enable_adaptive_verification": s.adaptive_verification,
                "draft_architecture": "Glm4MoeMTPModel", "multi_module_mtp": False, "speculator": "MTPSpeculator"}
    return {"runner": s.runner.name, "breakable": s.breakable, "ubatching": s.ubatching,
            "cudagraph_mode": post.cudagraph_mode.name, "compilation_mode": post.compilation_mode.name,
            "splitting_ops_contain_attention": post.splitting_ops_contain_attention, "speculative": spec,
            "extensible_kv_cache": True, "architecture": "Glm4MoeForCausalLM", "attention_backend": plan.backend,
            "attention_support": {c: s.attention_support.name for c in plan.capabilities}, "refused_on": {},
            "quantization": "fp8" if "--quantization" in plan.extra else None,
            "lora": [s.max_loras, s.specialize_active_lora] if s.max_loras else None}


@pytest.mark.parametrize("key, value, line", [
    ("runner", "MRV1", "runner: scenario MRV2, vLLM MRV1"),
    ("breakable", True, "breakable: scenario False, vLLM True"),
    ("ubatching", True, "ubatching"),
    ("cudagraph_mode", "FULL", "cudagraph_mode after post_init: scenario FULL_AND_PIECEWISE, vLLM FULL"),
    ("compilation_mode", "NONE", "compilation mode after post_init"),
    ("splitting_ops_contain_attention", False, "splitting_ops contain attention"),
    ("attention_backend", "FLASHINFER", "attention backend: scenario TRITON_ATTN, vLLM FLASHINFER"),
    ("attention_support", {"9.0": "UNIFORM_BATCH"}, "attention_support: scenario ALWAYS"),
    ("refused_on", {"9.0": "draft: not valid"}, "attention backend selection: vLLM refuses it on compute capability 9.0"),
    ("quantization", None, "quantization: scenario fp8, vLLM None"),
    ("extensible_kv_cache", False, "extensible_kv_cache: scenario True, vLLM False"),
    ("architecture", "Qwen3ForCausalLM", None),  # compiled as well: nothing the scenario names differs
    ("speculative", None, "drafter: scenario WITH_MODEL, vLLM has no speculative config"),
    ("speculative.num_speculative_tokens", 2, "num_speculative_tokens: scenario 1, vLLM 2"),
    ("speculative.enforce_eager", True, "spec enforce_eager"),
    ("speculative.enable_adaptive_verification", True, "adaptive_verification"),
    ("speculative.speculator", "MultiModuleMTPSpeculator", "speculator: scenario eagle, vLLM multi_module_mtp"),
    ("speculative.draft_architecture", "LlamaForCausalLMEagle3", "draft_compiled: scenario False, vLLM True"),
    ("speculative.method", "ngram", "drafter: scenario WITH_MODEL, vLLM WITHOUT_MODEL"),
    ("lora", [1, False], "LoRA (max_loras, specialize_active_lora): scenario None, vLLM [1, False]"),
])
def test_compare_reports_each_setting_that_differs(key, value, line):
    plan = reach.reach(MTP_UNCOMPILED, "0.34.0").plan
    observed = _observed(plan)
    ok = engine_check.Result("x", observed, None, 0.0)
    assert engine_check.compare(plan, ok) == []
    wrong = json.loads(json.dumps(observed))
    if "." in key:
        outer, inner = key.split(".")
        wrong[outer][inner] = value
    else:
        wrong[key] = value
    failures = engine_check.compare(plan, engine_check.Result("x", wrong, None, 0.0))
    if line is None:
        assert failures == []
    else:
        assert any(f.startswith(line) for f in failures), failures
    refused = engine_check.compare(plan, engine_check.Result("x", None, "ValueError: no", 0.0))
    assert refused == ["config: vLLM 0.34.0 refused the command: ValueError: no"]


def test_a_scenario_vllm_refuses_is_matched_by_a_refusal():
    s = Scenario(runner=Runner.MRV2, cudagraph_mode=FULL_AND_PIECEWISE, drafter=DrafterKind.WITH_MODEL,
                 uniform_decode_query_len=2, adaptive_verification=True,
                 splitting_ops=__import__("contract.core.scenario", fromlist=["SplittingOps"]).SplittingOps.EMPTY)
    plan = reach.reach(s, "0.34.0").plan  # post_init keeps FULL: adaptive verification is allowed
    assert engine_check.compare(plan, engine_check.Result("x", None, "ValueError: refused", 0.0))


def test_the_child_result_is_validated():
    req = [engine_check.Request("a", {}, ["m"]), engine_check.Request("b", {}, ["m"])]
    good = {"schema": engine_check.SCHEMA, "version": engine_check.VERSION, "release": "0.34.0",
            "results": [{"id": "a", "error": "ValueError: x"},
                        {"id": "b", "observed": {k: None for k in engine_check.OBSERVED}}]}
    assert [r.id for r in engine_check.validate(good, "0.34.0", req)] == ["a", "b"]
    bad = [
        {**good, "schema": "other"},
        {**good, "release": "0.33.0"},
        {**good, "results": good["results"][:1]},
        {**good, "results": [good["results"][1], good["results"][0]]},
        {**good, "results": [{"id": "a"}, good["results"][1]]},
        {**good, "results": [{"id": "a", "error": "x", "observed": {}}, good["results"][1]]},
        {**good, "results": [good["results"][0], {"id": "b", "observed": {"runner": "MRV2"}}]},
    ]
    for data in bad:
        with pytest.raises(engine_check.CheckError):
            engine_check.validate(data, "0.34.0", req)


def test_hf_cache_layout(tmp_path):
    home = engine_check.hf_cache(tmp_path)
    config = home / "hub" / "models--zai-org--GLM-4.5-Air" / "snapshots" / engine_check.SNAPSHOT / "config.json"
    assert json.loads(config.read_text())["architectures"] == ["Glm4MoeForCausalLM"]
    assert (home / "hub" / "models--zai-org--GLM-4.5-Air" / "refs" / "main").read_text() == engine_check.SNAPSHOT
    for path in reach.HF_CONFIGS.glob("*/*/config.json"):
        assert path.stat().st_size < 4096, path  # config-sized files only


def test_compile_status_is_read_through_imports_bases_and_class_attributes(tmp_path):
    """The static reading on a small tree shaped like vLLM's: decorated classes found through a
    relative import, a base class, a class attribute (``model_cls = X``), a factory argument and
    ``enable_if``; ``@ignore_torch_compile`` stops an inherited decoration."""
    models = tmp_path / "model_executor" / "models"
    models.mkdir(parents=True)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "speculative.py").write_text(textwrap.dedent('''
        class SpeculativeConfig:
            @staticmethod
            def hf_config_override(hf_config):
                if hf_config.architectures[0] == "BaseForCausalLM":
                    hf_config.update({"architectures": ["BaseMTPModel"]})
    '''))
    (models / "registry.py").write_text(textwrap.dedent('''
        _TEXT_GENERATION_MODELS = {
            "BaseForCausalLM": ("base", "BaseForCausalLM"),
            "ViaAttrForCausalLM": ("base", "ViaAttr"),
            "IgnoredForCausalLM": ("base", "Ignored"),
            "FactoryForCausalLM": ("base", "Factory"),
        }
        _MULTIMODAL_MODELS = {}
        _SPECULATIVE_DECODING_MODELS = {
            "BaseMTPModel": ("base_mtp", "BaseMTP"),
            "CondMTPModel": ("base_mtp", "CondMTP"),
            "DynMTPModel": ("base_mtp", "DynMTP"),
        }
    '''))
    (models / "layers.py").write_text(textwrap.dedent('''
        from vllm.compilation.decorators import support_torch_compile
        class DecoderLayer:
            pass
        @support_torch_compile
        class BaseModel:
            def __init__(self):
                self.layers = [DecoderLayer()]
        def should_compile(cfg):
            return True
        @support_torch_compile(enable_if=should_compile)
        class CondModel:
            pass
    '''))
    (models / "base.py").write_text(textwrap.dedent('''
        from vllm.compilation.decorators import ignore_torch_compile
        from .layers import BaseModel, DecoderLayer
        class BaseForCausalLM:
            def __init__(self):
                self.model = BaseModel()
        class ViaAttr:
            model_cls = BaseModel
            def __init__(self):
                self.model = self.model_cls()
        @ignore_torch_compile
        class Ignored(BaseModel):
            pass
        def make(factory):
            return factory()
        class Factory:
            def __init__(self):
                self.model = make(BaseModel)
    '''))
    (models / "base_mtp.py").write_text(textwrap.dedent('''
        from .layers import DecoderLayer, CondModel
        from .utils import init_vllm_registered_model
        class BaseMTP:
            def __init__(self):
                self.block = DecoderLayer()
        class CondMTP:
            def __init__(self):
                self.model = CondModel()
        class DynMTP:
            def __init__(self):
                self.model = init_vllm_registered_model()
    '''))
    facts = model_facts.read("test", tmp_path)
    status = {m.arch: m.status for m in (*facts.targets, *facts.drafts)}
    assert status == {"BaseForCausalLM": model_facts.COMPILED, "ViaAttrForCausalLM": model_facts.COMPILED,
                      "IgnoredForCausalLM": model_facts.NOT_COMPILED, "FactoryForCausalLM": model_facts.COMPILED,
                      "BaseMTPModel": model_facts.NOT_COMPILED, "CondMTPModel": model_facts.CONDITIONAL,
                      "DynMTPModel": model_facts.UNKNOWN}
    assert facts.target("BaseForCausalLM").decorated == ("layers.BaseModel (layers.py:6)",)
    assert facts.draft("CondMTPModel").decorated == ("layers.CondModel (layers.py:12) enable_if=should_compile",)
    assert dict(facts.mtp_sources) == {"BaseMTPModel": ("BaseForCausalLM",)}


def test_several_ranks_name_their_size_and_mrv2s_micro_batching_its_thresholds():
    ranks = reach.reach(Scenario(runner=Runner.MRV2, data_parallel_size=3), "0.34.0").plan
    assert ranks.extra == ("--data-parallel-size", "3") and ranks.gpus == 3
    dbo = reach.reach(Scenario(runner=Runner.MRV2, cudagraph_mode=FULL, data_parallel_size=2, ubatching=True),
                      "0.34.0").plan
    flags = " ".join(dbo.extra)
    assert "--data-parallel-size 2 --enable-expert-parallel --all2all-backend deepep_low_latency --enable-dbo" in flags
    assert "--dbo-decode-token-threshold 2 --dbo-prefill-token-threshold 4" in flags and dbo.gpus == 2
    mrv1 = reach.reach(Scenario(runner=Runner.MRV1, ubatching=True), "0.33.0").plan
    assert "--dbo-decode-token-threshold" not in mrv1.extra and mrv1.gpus == 2
