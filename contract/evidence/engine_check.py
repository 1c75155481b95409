"""Runs reproduction commands through a vLLM release's own argument parser and config code on CPU,
and reports the settings vLLM ends up with.

The child (``python -m contract.evidence.engine_check IN.json OUT.json`` in the release's venv,
``PYTHONPATH`` the project root) reads a JSON of commands, and for each one: sets the command's
environment variables, parses its argv with ``FlexibleArgumentParser`` and
``EngineArgs.add_cli_args`` (``vllm serve``'s own parser, ``entrypoints/cli/serve.py``), builds
``EngineArgs.from_cli_args(...).create_engine_config()`` into a ``VllmConfig`` (its
``__post_init__`` normalisation included), and reads back what the scenario names: runner,
breakable, micro-batching, ``cudagraph_mode`` and compilation mode, splitting ops, the speculative
method, its token count, ``enforce_eager``, adaptive verification, the speculator MRV2 would build,
the extensible KV cache, the target and draft architectures, the attention backend, and the
``AttentionCGSupport`` the backend's metadata builder reports for this model at each GPU compute
capability (``get_builder_cls().get_cudagraph_support(vllm_config, kv_cache_spec)``, run on a
platform that answers that capability), and the capabilities on which vLLM's backend selection
(``get_attn_backend``) refuses the target's or the draft model's backend under this config, as
it does at model load (adaptive verification needs backends that accept trimmed device query
lengths).

Stand-ins, each a question vLLM asks of the machine rather than a rule of the contract:
the CUDA platform (``contract.real.platform``, its ``get_device_capability`` answering the
capability under test, and its ``get_attn_backend_cls`` the branch ``platforms/cuda.py`` takes for
a named backend); the model's Hugging Face ``config.json`` from ``hf_configs/`` in an
offline Hugging Face cache (``HF_HUB_OFFLINE=1``: nothing is downloaded, no weights, no tokenizer);
the registry's model inspection, run in-process (vLLM runs it in a fresh interpreter, which would
not see the simulated platform); ``vllm.vllm_flash_attn.flash_attn_interface``, the compiled
FlashAttention library, whose ``is_fa_version_supported`` answers per capability
(:data:`FA_VERSIONS`); the number of GPUs on the node (:data:`GPUS`, which ``ParallelConfig``
compares with the world size); Triton's presence (``HAS_TRITON``, which ``VllmConfig`` asks
before choosing Model Runner V2); whether FlashInfer's TRT-LLM kernels can be fetched
(``has_nvidia_artifactory()``, otherwise a network request; no unless a command says so); and the
``flashinfer``, ``torchvision`` and ``compressed_tensors`` packages, whose names the FlashInfer
backend, Llama 4's model module and the quantization registry (reached by ``--quantization fp8``)
import but which no config or support level calls (``contract.real.stub_library``).

The parent (:func:`check`) writes the request, runs the child and validates the JSON it writes;
:func:`compare` turns a result into one line per setting that differs from the scenario.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from contract.core import child
from contract.real.stub_library import StubLibrary

SCHEMA = "cudagraph-contract.engine-check"
VERSION = 1
ROOT = Path(__file__).resolve().parents[2]
# GPU kernel packages and others absent here whose names vLLM imports at module level
STUB_PACKAGES = ("flashinfer", "torchvision", "compressed_tensors")
HF_CONFIGS = Path(__file__).with_name("hf_configs")
# Compute capabilities the support level is evaluated at: A100 (8.0), A10/RTX 30 (8.6), L4/L40S/RTX 40
# (8.9), H100/H200/GH200 (9.0), B200/GB200 (10.0), B300/GB300 (10.3), RTX PRO 6000 Blackwell/RTX 50
# (12.0), DGX Spark GB10 (12.1).
CAPABILITIES = ("8.0", "8.6", "8.9", "9.0", "10.0", "10.3", "12.0", "12.1")
# The FlashAttention versions the compiled library offers per capability major (vllm-flash-attn
# builds FA2 for SM80+, FA3 for SM90 only, FA4 for SM100): what ``is_fa_version_supported`` answers.
FA_VERSIONS = {8: (2,), 9: (2, 3), 10: (2, 4), 12: (2,)}
# Snapshot name of the offline cache: a placeholder, not a claim about the checkpoint's revision.
SNAPSHOT = "0" * 40
# Fields a result's "observed" holds (the parent refuses a result without them).
OBSERVED = ("runner", "breakable", "ubatching", "cudagraph_mode", "compilation_mode",
            "splitting_ops_contain_attention", "speculative", "extensible_kv_cache", "architecture",
            "attention_backend", "attention_support", "refused_on", "quantization", "lora")


# ---------------------------------------------------------------------------------------------
# Parent side: no vLLM import.


@dataclass(frozen=True)
class Request:
    """One command to check: ``env`` and ``argv`` as ``vllm serve`` would get them.
    ``trtllm_cubins``: what FlashInfer's ``has_nvidia_artifactory()`` answers (the TRT-LLM kernels
    are downloadable or installed); False when not given, so that no check reaches the network."""

    id: str
    env: dict[str, str]
    argv: list[str]
    trtllm_cubins: bool = False

    def to_json(self) -> dict:
        return {"id": self.id, "env": self.env, "argv": self.argv, "trtllm_cubins": self.trtllm_cubins}


@dataclass(frozen=True)
class Result:
    id: str
    observed: dict | None  # None when vLLM refused the command
    error: str | None  # vLLM's refusal, one line
    seconds: float


class CheckError(Exception):
    """The child did not run or wrote something that is not a result for every command."""


def hf_cache(folder: Path) -> Path:
    """An offline Hugging Face cache (``hub/models--org--name/snapshots/<rev>/config.json`` and
    ``refs/main``) holding every stored ``config.json``; returns the ``HF_HOME`` to set."""
    hub = Path(folder) / "hub"
    for config in sorted(HF_CONFIGS.glob("*/*/config.json")):
        org, name = config.parent.parent.name, config.parent.name
        repo = hub / f"models--{org}--{name}"
        (repo / "snapshots" / SNAPSHOT).mkdir(parents=True, exist_ok=True)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(SNAPSHOT)
        (repo / "snapshots" / SNAPSHOT / "config.json").write_text(config.read_text())
    return Path(folder)


def check(release: str, python: Path, requests: list[Request], timeout: float = 600) -> tuple[list[Result], dict]:
    """Run ``requests`` in one child process of the release's Python; returns the results, in
    order, and the child's timings."""
    with tempfile.TemporaryDirectory(prefix="engine-check-") as tmp:
        tmp = Path(tmp)
        (tmp / "in.json").write_text(json.dumps({"schema": SCHEMA, "version": VERSION, "release": release,
                                                 "commands": [r.to_json() for r in requests]}))
        env = child.environment(PYTHONPATH=str(ROOT), VLLM_LOGGING_LEVEL="ERROR", HF_HOME=str(hf_cache(tmp / "hf")),
                                HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_CACHE_ROOT=str(tmp / "vllm-cache"))
        try:
            proc = child.run_command([str(Path(python).absolute()), "-m", "contract.evidence.engine_check",
                                      str(tmp / "in.json"), str(tmp / "out.json")], what=f"the vLLM {release} check",
                                     timeout=timeout, env=env, cwd=str(tmp))
        except child.ChildProblem as exc:
            raise CheckError(str(exc)) from None
        if proc.returncode != 0 or not (tmp / "out.json").exists():
            raise CheckError(f"the vLLM {release} check exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
        data = json.loads((tmp / "out.json").read_text())
    return validate(data, release, requests), data.get("timings", {})


def validate(data: object, release: str, requests: list[Request]) -> list[Result]:
    """The child's JSON as results, one per request in order; CheckError when it is not that."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or data.get("version") != VERSION:
        raise CheckError("the check wrote no engine-check result")
    if data.get("release") != release:
        raise CheckError(f"the check ran vLLM {data.get('release')!r}, not {release}")
    results = data.get("results")
    if not isinstance(results, list) or [r.get("id") if isinstance(r, dict) else None for r in results] != [
            r.id for r in requests]:
        raise CheckError("the check's results do not answer the commands one for one")
    out = []
    for r in results:
        observed, error = r.get("observed"), r.get("error")
        if (observed is None) == (error is None):
            raise CheckError(f"{r['id']}: a result has either observed settings or an error")
        if observed is not None and (not isinstance(observed, dict) or set(OBSERVED) - set(observed)):
            raise CheckError(f"{r['id']}: observed settings lack {sorted(set(OBSERVED) - set(observed or {}))}")
        if error is not None and not isinstance(error, str):
            raise CheckError(f"{r['id']}: error must be text")
        out.append(Result(r["id"], observed, error, float(r.get("seconds", 0.0))))
    return out


def compare(plan, result: Result) -> list[str]:
    """The settings in which vLLM's config differs from the plan's scenario, one line each: what
    the scenario needs (after the project's ``post_init``, ``contract/core/scenario.py``) and what vLLM
    built. ``plan`` is a ``reach.Plan``."""
    from contract.evidence import model_facts
    from contract.evidence.reach import MODELLESS, revision
    from contract.core.scenario import ConfigRejected, DrafterKind, Speculator, post_init

    s, release = plan.scenario, plan.release
    try:
        post = post_init(s, revision(release))
    except ConfigRejected as exc:
        if result.error is not None and not result.error.startswith("harness: "):
            return []
        return [f"config: the scenario's post_init refuses it ({exc}); vLLM {release} built a config"]
    if result.error is not None and result.error.startswith("harness: "):
        return [f"check: the config could not be read back ({result.error[len('harness: '):]})"]
    if result.error is not None:
        return [f"config: vLLM {release} refused the command: {result.error}"]
    o = result.observed
    out = []

    def differs(name: str, want, got) -> None:
        if want != got:
            out.append(f"{name}: scenario {want}, vLLM {got}")

    differs("runner", s.runner.name, o["runner"])
    differs("breakable", s.breakable, o["breakable"])
    differs("ubatching", s.ubatching, o["ubatching"])
    if s.ubatching and "num_ubatches" in o:
        differs("micro-batches per step", s.num_ubatches, o["num_ubatches"])
    differs("cudagraph_mode after post_init", post.cudagraph_mode.name, o["cudagraph_mode"])
    differs("compilation mode after post_init", post.compilation_mode.name, o["compilation_mode"])
    differs("splitting_ops contain attention", post.splitting_ops_contain_attention, o["splitting_ops_contain_attention"])
    differs("attention backend", plan.backend, o["attention_backend"])
    differs("quantization", "fp8" if "--quantization" in plan.extra else None, o["quantization"])
    support = o["attention_support"]
    if not isinstance(support, dict):
        out.append(f"attention_support: {support}")
    else:
        # a draft-only weaker backend (``reach``: speculative_config's attention_backend) leaves the
        # target on an ALWAYS backend: the backend observed here is the target's
        expected = "ALWAYS" if s.attention_support_draft_only else s.attention_support.name
        wrong = {c: support.get(c) for c in plan.capabilities if support.get(c) != expected}
        if wrong or not plan.capabilities:
            out.append(f"attention_support: scenario {expected} (the target's) on compute capability "
                       f"{', '.join(plan.capabilities) or '(none)'}, vLLM "
                       + ", ".join(f"{level} on {c}" for c, level in wrong.items()))
    refused = {c: why for c, why in o["refused_on"].items() if c in plan.capabilities}
    if refused:
        out.append("attention backend selection: vLLM refuses it on compute capability "
                   + "; ".join(f"{c}: {why}" for c, why in refused.items()))
    facts = model_facts.committed().get(release)
    target = facts.target(o["architecture"]) if facts else None
    status = target.status if target else "unknown"
    differs("model_compiled", s.model_compiled, status == model_facts.COMPILED)
    if not s.extensible_kv_cache or o["extensible_kv_cache"] is not None:
        differs("extensible_kv_cache", s.extensible_kv_cache, o["extensible_kv_cache"])
    differs("LoRA (max_loras, specialize_active_lora)",
            [s.max_loras, s.specialize_active_lora] if s.max_loras else None, o["lora"])
    spec = o["speculative"]
    if s.drafter is DrafterKind.NONE:
        if spec is not None:
            out.append(f"drafter: scenario NONE, vLLM speculative method {spec['method']}")
        return out
    if spec is None:
        out.append(f"drafter: scenario {s.drafter.name}, vLLM has no speculative config")
        return out
    kind = DrafterKind.WITHOUT_MODEL if spec["method"] in MODELLESS else DrafterKind.WITH_MODEL
    differs("drafter", s.drafter.name, kind.name)
    differs("num_speculative_tokens", s.uniform_decode_query_len - 1, spec["num_speculative_tokens"])
    differs("spec enforce_eager", s.spec_enforce_eager, spec["enforce_eager"])
    differs("adaptive_verification", s.adaptive_verification, spec["enable_adaptive_verification"])
    if kind is DrafterKind.WITH_MODEL:  # MRV1: EagleProposer, or DraftModelProposer for draft_model
        built = (SPECULATORS.get(spec["speculator"], spec["speculator"]) if s.runner.name == "MRV2" else
                 Speculator.STANDALONE_AR.value if spec["method"] == "draft_model" else Speculator.EAGLE.value)
        differs("speculator", s.speculator.value, built)
    if kind is DrafterKind.WITH_MODEL:
        draft = facts.draft(spec["draft_architecture"]) if facts else None
        draft = draft or (facts.target(spec["draft_architecture"]) if facts else None)
        dstatus = draft.status if draft else "unknown"
        if s.runner.name == "MRV2" or not s.draft_compiled:
            differs("draft_compiled", s.draft_compiled, dstatus == model_facts.COMPILED)
    return out


# ---------------------------------------------------------------------------------------------
# Child side: runs in the release's venv.

# Imported before the platform turns CUDA (``contract.real.platform``): modules whose
# import-time code takes CUDA branches that need the compiled extensions.
PRE_IMPORTS = (
    "vllm.envs",
    "vllm.config",
    "vllm.engine.arg_utils",
    "vllm.v1.attention.backend",
    "vllm.v1.attention.selector",
    "vllm.compilation.backends",  # the selector reads its model_tag
    "vllm.model_executor.model_loader",
    "vllm.model_executor.models.registry",
    "vllm.model_executor.layers.attention.chunked_local_attention",
    "vllm.v1.attention.backends.flash_attn",
    "vllm.v1.attention.backends.flashinfer",
    "vllm.v1.attention.backends.triton_attn",
    "vllm.v1.attention.backends.flex_attention",
)
GPUS = 8
# --quantization fp8's modules, whose class bodies ask vllm._C whether CUTLASS has FP8
# (``34:model_executor/layers/quantization/online/fp8.py:201``); the ones a release has.
QUANTIZATION_IMPORTS = ("vllm.model_executor.layers.quantization.fp8",
                        "vllm.model_executor.layers.quantization.online.base")


def present(modules: tuple[str, ...]) -> tuple[str, ...]:
    """The ``modules`` this vLLM installation has, found by file, without importing anything."""
    import importlib.util

    root = Path(importlib.util.find_spec("vllm").origin).parent.parent
    return tuple(m for m in modules if (root / (m.replace(".", "/") + ".py")).is_file()
                 or (root / m.replace(".", "/") / "__init__.py").is_file())


def model_modules(release: str) -> tuple[str, ...]:
    """The modules of the stored checkpoints' architectures and of the MTP drafts made from them
    (``model_facts``: the registry's table and ``hf_config_override``)."""
    from contract.evidence import model_facts

    facts = model_facts.committed().get(release)
    if facts is None:
        return ()
    archs, types = set(), set()
    for config in HF_CONFIGS.glob("*/*/config.json"):
        data = json.loads(config.read_text())
        archs.update(data.get("architectures") or ())
        types.add(data.get("model_type"))
    mtp = {arch for arch, sources in facts.mtp_sources if set(sources) & (archs | types)}
    modules = []
    for arch in sorted(archs | mtp):
        row = facts.model(arch)
        if row is not None:
            modules.append(row.cls.rpartition(".")[0])
    return tuple(dict.fromkeys(modules))


# Speculator classes MRV2 builds, by name, with what the scenario calls them
# (``33:v1/worker/gpu/spec_decode/__init__.py:14-94``; ``34:…/speculator_config.py``).
SPECULATORS = {
    "EagleSpeculator": "eagle", "MTPSpeculator": "eagle", "Gemma4Speculator": "eagle",
    "MultiModuleMTPSpeculator": "multi_module_mtp",
    "DFlashSpeculator": "dflash", "DFlash2Speculator": "dflash", "XPressSpeculator": "dflash",
    "LiLiCorrSpeculator": "dflash", "DSparkSpeculator": "dflash",
    "StandaloneARSpeculator": "standalone_ar",
    "NgramGPUSpeculator": None, "SuffixSpeculator": None, "ExtractHiddenStatesSpeculator": None,
}


def _install_fa_stub() -> None:
    """``vllm.vllm_flash_attn`` (the compiled FlashAttention package, whose ``__init__`` refuses to
    import without its CUDA extensions) with ``flash_attn_interface`` answering as the library
    would on the capability under test (:data:`FA_VERSIONS`)."""
    import types

    from vllm.platforms import current_platform

    def is_fa_version_supported(fa_version: int, device=None) -> bool:
        return fa_version in FA_VERSIONS.get(current_platform.get_device_capability().major, ())

    def fa_version_unsupported_reason(fa_version: int, device=None):
        return None if is_fa_version_supported(fa_version) else f"FA{fa_version} is not built for this GPU"

    interface = types.ModuleType("vllm.vllm_flash_attn.flash_attn_interface")
    interface.is_fa_version_supported = is_fa_version_supported
    interface.fa_version_unsupported_reason = fa_version_unsupported_reason
    package = types.ModuleType("vllm.vllm_flash_attn")
    package.__path__ = []
    package.flash_attn_interface = interface
    package.is_fa_version_supported = is_fa_version_supported
    package.fa_version_unsupported_reason = fa_version_unsupported_reason
    sys.modules["vllm.vllm_flash_attn"] = package
    sys.modules["vllm.vllm_flash_attn.flash_attn_interface"] = interface


def _set_trtllm(available: bool) -> None:
    """``has_nvidia_artifactory()`` (``utils/flashinfer.py``) asks the network whether FlashInfer's
    TRT-LLM kernels can be downloaded; answer it instead."""
    try:
        from vllm.utils import flashinfer as fi
    except ImportError:
        return
    fi.has_nvidia_artifactory = lambda: available
    fn = getattr(fi, "supports_trtllm_attention", None)
    if fn is not None and hasattr(fn, "cache_clear"):
        fn.cache_clear()


def _set_capability(plat, capability: str) -> None:
    from vllm.platforms.interface import DeviceCapability

    major, minor = (int(x) for x in capability.split("."))
    type(plat).get_device_capability = classmethod(lambda cls, device_id=0: DeviceCapability(major, minor))
    # functools.cache'd answers that depend on the capability (utils/flashinfer.py)
    try:
        from vllm.utils import flashinfer as fi

        for name in ("supports_trtllm_attention",):
            fn = getattr(fi, name, None)
            if fn is not None and hasattr(fn, "cache_clear"):
                fn.cache_clear()
    except ImportError:
        pass


def _speculator(release: str, vllm_config) -> str | None:
    """The class name MRV2's ``init_speculator`` would build: 0.34 names it in the speculator
    config; 0.33's ``if``/``elif`` is run from the release's source with each ``return Cls(...)``
    made ``return "Cls"`` (the branch order is vLLM's; no speculator is constructed)."""
    import ast
    import inspect

    spec = vllm_config.speculative_config
    config = getattr(spec, "speculator_config", None)
    if config is not None and getattr(config, "speculator_class", None):
        return config.speculator_class.rpartition(".")[2]
    try:
        from vllm.v1.worker.gpu import spec_decode
    except ImportError:
        return None
    fn = getattr(spec_decode, "init_speculator", None)
    if fn is None:
        return None
    tree = ast.parse(inspect.getsource(spec_decode))
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "init_speculator")

    class Names(ast.NodeTransformer):
        def visit_ImportFrom(self, n):  # the speculator modules need CUDA kernels
            return ast.Pass()

        def visit_Return(self, n):
            if isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name):
                return ast.Return(ast.Constant(n.value.func.id))
            return n

    node = ast.fix_missing_locations(Names().visit(node))
    scope = dict(vars(spec_decode))
    exec(compile(ast.Module([node], []), inspect.getsourcefile(spec_decode), "exec"), scope)
    params = len(inspect.signature(scope["init_speculator"]).parameters)
    try:
        return scope["init_speculator"](vllm_config, *[None] * (params - 1))
    except NotImplementedError:
        return None


def _kv_spec(vllm_config):
    import dataclasses

    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    mc, pc = vllm_config.model_config, vllm_config.parallel_config
    values = dict(block_size=16, num_kv_heads=mc.get_num_kv_heads(pc), head_size=mc.get_head_size(),
                  dtype=torch.bfloat16)
    fields = {f.name for f in dataclasses.fields(FullAttentionSpec)}
    return FullAttentionSpec(**{k: v for k, v in values.items() if k in fields})


def _import_time_level(builder, level):
    """A builder whose ``get_cudagraph_support`` returns the class attribute ``_cudagraph_support``
    gets that attribute when its module is imported, on the GPU vLLM runs on and under the config
    being built (FlashAttention: ``get_flash_attn_version() in (3, 4)``,
    ``v1/attention/backends/flash_attn.py``). Here the module was imported once, before the platform
    was CUDA, so the assignment's expression is evaluated again, in the module's namespace, for the
    capability under test; a constant assignment, or an override that returns something else,
    keeps ``level``."""
    import ast
    import inspect
    import textwrap

    for klass in builder.__mro__:
        if "_cudagraph_support" not in vars(klass):
            continue
        if level != vars(klass)["_cudagraph_support"]:
            return level
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            return level
        cls_node = tree.body[0]
        for node in getattr(cls_node, "body", []):
            target = node.target if isinstance(node, ast.AnnAssign) else (
                node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
            if isinstance(target, ast.Name) and target.id == "_cudagraph_support" and node.value is not None:
                if isinstance(node.value, ast.Attribute):
                    return level
                module = sys.modules[klass.__module__]
                return eval(compile(ast.Expression(node.value), inspect.getsourcefile(klass), "eval"),
                            vars(module))
        return level
    return level


def _support(plat, vllm_config, capabilities) -> dict[str, str] | str:
    """Per capability, the minimum ``AttentionCGSupport`` over the model's attention kinds: the
    chosen backend's builder, and for a model with ``attention_chunk_size`` (Llama 4) the chunked
    local-attention builder vLLM derives from it
    (``model_executor/layers/attention/chunked_local_attention.py``)."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    backend = vllm_config.attention_config.backend
    if backend is None:
        return "no --attention-backend: vLLM chooses at model load"
    backend_cls = AttentionBackendEnum[backend.name].get_class()
    builders = [backend_cls.get_builder_cls()]
    chunk = getattr(vllm_config.model_config, "attention_chunk_size", None)
    if chunk:
        from vllm.model_executor.layers.attention.chunked_local_attention import (
            create_chunked_local_attention_backend,
        )

        builders.append(create_chunked_local_attention_backend(backend_cls, chunk).get_builder_cls())
    spec = _kv_spec(vllm_config)
    out = {}
    with set_current_vllm_config(vllm_config):
        for capability in capabilities:
            _set_capability(plat, capability)
            levels = [_import_time_level(b, b.get_cudagraph_support(vllm_config, spec)) for b in builders]
            out[capability] = min(levels, key=lambda x: x.value).name
    _set_capability(plat, "9.0")
    return out


def _selection_stand_in(plat) -> None:
    """``CudaPlatform.get_attn_backend_cls``'s branch for a named backend (``platforms/cuda.py``,
    ``34:platforms/cuda.py:471-490``): the backend's own ``validate_configuration`` at the
    capability under test, a ``ValueError`` naming its reasons when it has any. The module itself
    cannot be imported without a GPU; every command names its backend, so the other branch (the
    priority list) is never asked."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None):
        backend_class = AttentionBackendEnum[selected_backend.name].get_class()
        reasons = backend_class.validate_configuration(device_capability=cls.get_device_capability(),
                                                       **attn_selector_config._asdict())
        if reasons:
            raise ValueError(f"Selected backend {selected_backend} is not valid for this configuration. "
                             f"Reason: {reasons}")
        return f"{backend_class.__module__}.{backend_class.__qualname__}"

    type(plat).get_attn_backend_cls = classmethod(get_attn_backend_cls)


def _refused(plat, vllm_config, capabilities) -> dict[str, str]:
    """Per capability, vLLM's refusal to select the target's or the draft model's attention backend
    (``v1/attention/selector.py``, ``get_attn_backend``, which reads adaptive verification from the
    config), as the model's layers ask for it at load; absent where both are accepted."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention import selector

    roles = [("target", vllm_config, vllm_config.model_config)]
    spec = vllm_config.speculative_config
    if spec is not None and getattr(spec, "draft_model_config", None) is not None:
        draft = spec.apply_draft_overrides(vllm_config) if hasattr(spec, "apply_draft_overrides") else vllm_config
        roles.append(("draft", draft, spec.draft_model_config))
    out = {}
    for capability in capabilities:
        _set_capability(plat, capability)
        for role, config, model in roles:
            if role == "draft" and getattr(spec, "attention_backend", None) is None and draft is vllm_config:
                continue
            selector._cached_get_attn_backend.cache_clear()
            try:
                with set_current_vllm_config(config):
                    selector.get_attn_backend(model.get_head_size(), model.dtype, config.cache_config.cache_dtype,
                                              use_mla=model.use_mla)
            except ValueError as exc:
                out.setdefault(capability, f"{role}: {' '.join(str(exc).split())[:300]}")
    _set_capability(plat, "9.0")
    return out


def _observe(release: str, plat, vllm_config) -> dict:
    cc = vllm_config.compilation_config
    runner = "MRV2"
    if hasattr(type(vllm_config), "use_v2_model_runner"):
        runner = "MRV2" if vllm_config.use_v2_model_runner else "MRV1"
    from vllm.compilation import breakable_cudagraph as bc

    try:
        breakable = bool(bc.is_breakable_cudagraph_enabled(cc))
    except TypeError:  # before 0.34 it reads the environment only
        breakable = bool(bc.is_breakable_cudagraph_enabled())
    spec = vllm_config.speculative_config
    speculative = None
    if spec is not None:
        draft = getattr(spec, "draft_model_config", None)
        speculative = {
            "method": spec.method,
            "num_speculative_tokens": spec.num_speculative_tokens,
            "enforce_eager": bool(spec.enforce_eager),
            "enable_adaptive_verification": bool(getattr(spec, "enable_adaptive_verification", False)),
            "draft_architecture": (draft.architectures[0] if draft is not None and draft.architectures else None),
            "multi_module_mtp": bool(spec.use_multi_module_mtp()) if hasattr(spec, "use_multi_module_mtp") else False,
            "speculator": _speculator(release, vllm_config) if runner == "MRV2" else None,
        }
    backend = vllm_config.attention_config.backend
    return {
        "runner": runner,
        "breakable": breakable,
        "ubatching": bool(vllm_config.parallel_config.use_ubatching),
        "num_ubatches": vllm_config.parallel_config.num_ubatches,
        "cudagraph_mode": cc.cudagraph_mode.name,
        "compilation_mode": cc.mode.name,
        "splitting_ops_contain_attention": bool(cc.splitting_ops_contain_attention()),
        "speculative": speculative,
        "extensible_kv_cache": getattr(vllm_config.cache_config, "enable_extensible_kv_cache", None),
        "architecture": vllm_config.model_config.architectures[0],
        "attention_backend": backend.name if backend is not None else None,
        "attention_support": _support(plat, vllm_config, CAPABILITIES),
        "refused_on": _refused(plat, vllm_config, CAPABILITIES) if backend is not None else {},
        "quantization": vllm_config.model_config.quantization,
        "lora": (None if vllm_config.lora_config is None else
                 [vllm_config.lora_config.max_loras,
                  bool(getattr(vllm_config.lora_config, "specialize_active_lora", False))]),
    }


def run(request: dict) -> dict:
    started = time.monotonic()
    release = request["release"]
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from contract.real import platform

    sys.meta_path.insert(0, StubLibrary(STUB_PACKAGES))
    # Imports that must not see the CUDA platform happen inside activate, before the flip: the
    # fixed list and the model modules of every stored checkpoint and its MTP draft.
    plat = platform.activate(PRE_IMPORTS + present(QUANTIZATION_IMPORTS) + model_modules(release))
    # A machine with GPUs enough for any command (ParallelConfig checks the world size fits).
    type(plat).device_count = classmethod(lambda cls: GPUS)
    # Triton ships with vLLM on CUDA; VllmConfig asks before choosing Model Runner V2
    # (config/vllm.py, use_v2_model_runner and its validation), and this CPU build lacks it.
    import vllm.config.vllm as config_vllm

    if hasattr(config_vllm, "HAS_TRITON"):
        config_vllm.HAS_TRITON = True
    import vllm.envs as envs
    from vllm.model_executor.models import registry

    # The registry inspects a model class in a fresh interpreter (registry.py, _run_in_subprocess),
    # which would not have the simulated platform: inspect in this one.
    registry._run_in_subprocess = lambda fn: fn()
    _install_fa_stub()
    _selection_stand_in(plat)
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # platform.activate set these for the replay; each command sets its own.
    for name in ("VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_BREAKABLE_CUDAGRAPH"):
        os.environ.pop(name, None)
    baseline = dict(os.environ)
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    activated = time.monotonic()
    results = []
    for command in request["commands"]:
        t0 = time.monotonic()
        os.environ.clear()
        os.environ.update(baseline)
        os.environ.update(command["env"])
        if hasattr(envs, "disable_envs_cache"):
            envs.disable_envs_cache()
        _set_capability(plat, "9.0")
        _set_trtllm(bool(command.get("trtllm_cubins", False)))
        entry = {"id": command["id"]}
        try:
            args = parser.parse_args(["--model", *command["argv"]] if not command["argv"][0].startswith("-")
                                     else command["argv"])
            vllm_config = EngineArgs.from_cli_args(args).create_engine_config()
        except (Exception, SystemExit) as exc:  # vLLM's refusal is the observation
            entry["error"] = " ".join(f"{type(exc).__name__}: {exc}".split())[:600]
        else:
            # reading the built config back is this module's code: a failure there is a harness
            # error, reported as such rather than as vLLM's refusal
            try:
                entry["observed"] = _observe(release, plat, vllm_config)
            except Exception as exc:
                entry["error"] = "harness: " + " ".join(f"{type(exc).__name__}: {exc}".split())[:600]
        entry["seconds"] = round(time.monotonic() - t0, 3)
        results.append(entry)
    return {"schema": SCHEMA, "version": VERSION, "release": release, "results": results,
            "timings": {"start": round(activated - started, 2), "commands": round(time.monotonic() - activated, 2)}}


def support_requests() -> list[Request]:
    """The commands behind ``release_facts.json``'s tables: each of ``release_facts.SUPPORT_VARIANTS``
    alone, then with an EAGLE-3 draft under adaptive verification (the draft on the same backend)."""
    from contract.evidence.reach import EAGLE_HEAD
    from contract.evidence.release_facts import SUPPORT_MODEL, SUPPORT_VARIANTS, variant_key

    adaptive = json.dumps({"method": "eagle3", "model": EAGLE_HEAD, "num_speculative_tokens": 1,
                           "enable_adaptive_verification": True})
    out = []
    for backend, config, cubins in SUPPORT_VARIANTS:
        argv = [SUPPORT_MODEL, "--max-model-len", "4096", "--attention-backend", backend]
        if config:
            argv += ["--attention-config", json.dumps(config)]
        key = f"{backend} {variant_key(config, cubins)}"
        out.append(Request(key, {}, argv, bool(cubins)))
        out.append(Request(f"{key} adaptive", {}, argv + ["--speculative-config", adaptive], bool(cubins)))
    return out


def support_tables(results: list[Result]) -> tuple[dict, dict]:
    """From the results of ``support_requests()``, in order: backend -> variant -> capability ->
    level (an error stands for the level), and backend -> variant -> the capabilities on which vLLM
    refuses to select the backend under adaptive verification; where vLLM refuses adaptive
    verification itself for an EAGLE-3 draft, that refusal (``{"refused": message}``)."""
    from contract.evidence.release_facts import SUPPORT_VARIANTS, variant_key

    table: dict[str, dict] = {}
    refused: dict = {}
    for (backend, config, cubins), r, a in zip(SUPPORT_VARIANTS, results[::2], results[1::2]):
        key = variant_key(config, cubins)
        table.setdefault(backend, {})[key] = r.observed["attention_support"] if r.observed else r.error
        if a.observed is not None and a.observed["speculative"]["enable_adaptive_verification"]:
            refused.setdefault(backend, {})[key] = [c for c in CAPABILITIES if c in a.observed["refused_on"]]
    if not refused:
        errors = {a.error for a in results[1::2] if a.error}
        refused = {"refused": min(errors)[:300]} if errors else {}
    return table, refused


def support_table(release: str, python: Path) -> tuple[dict, dict]:
    """``support_tables`` run on ``release``; CheckError where a level could not be read."""
    results, _ = check(release, python, support_requests())
    table, refused = support_tables(results)
    bad = [f"{b} {v}: {level}" for b, variants in table.items() for v, level in variants.items()
           if not isinstance(level, dict)]
    if bad:
        raise CheckError(f"on vLLM {release}: {'; '.join(bad)}")
    return table, refused


def write_support_table(release: str, python: Path) -> None:
    from contract.evidence.release_facts import TABLE
    from contract.core.output import write_atomic

    table, refused = support_table(release, python)
    data = json.loads(TABLE.read_text())
    data.setdefault(release, {})["support_by_capability"] = table
    data[release]["adaptive_refused_by_capability"] = refused
    write_atomic(TABLE, json.dumps(dict(sorted(data.items())), indent=1) + "\n")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--support-table"] and len(argv) in (2, 3):
        release = argv[1]
        python = Path(argv[2]) if len(argv) == 3 else ROOT / f".venv-vllm-{release}" / "bin" / "python"
        write_support_table(release, python)
        return 0
    if len(argv) != 2:
        print("usage: python -m contract.evidence.engine_check IN.json OUT.json\n"
              "       python -m contract.evidence.engine_check --support-table VERSION [PYTHON]", file=sys.stderr)
        return 2
    request = json.loads(Path(argv[0]).read_text())
    if request.get("schema") != SCHEMA or request.get("version") != VERSION:
        print(f"{argv[0]}: not an engine-check request", file=sys.stderr)
        return 2
    out = run(request)
    Path(argv[1]).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
