"""A runner family: one vLLM model runner behind one interface, model side and real side.

Model Runner V1 (``v1/worker/gpu_model_runner.py``, to vLLM 0.33) and Model Runner V2
(``v1/worker/gpu/``, from 0.33; the only runner from 0.34) differ in who captures, how dispatch
works and when capture is legal. Each is a package under ``contract/runners/`` with a model side
(``model/``, pure Python) and a real side (``real/``, vLLM's own code on a simulated or real CUDA
layer), named after the vLLM files they mirror, and a tree reader (``branch.py``); each builds one
``Family``. Every command reaches a runner through it (``contract/families.py``); the core imports
no family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from contract.core.engine import Engine
from contract.core.scenario import Runner


@dataclass(frozen=True)
class SizeModel:
    """A runner's capture sizes: the lists it serves from, the best graph they give each batch, and
    its real side (``contract/runners/<runner>/{model,real}/sizes.py``)."""

    releases: tuple[str, ...]  # "major.minor" of the releases whose derivation the model has
    lists: Callable  # (setting, release) -> Derived: the lists the runner's dispatch keys from
    best_graph: Callable  # (setting, Derived, release) -> (Batch -> the best mode a graph gives)
    observe: Callable  # (session, [SizeSetting]) -> one record per setting, vLLM's code
    dispatch: str  # what picks each batch's graph in vLLM: "CudaGraphManager.dispatch"

    def models(self, version: str) -> bool:
        return ".".join(version.split(".")[:2]) in self.releases


@dataclass(frozen=True)
class Family:
    name: str  # the --runner value: "mrv1", "mrv2"
    runner: Runner
    title: str  # "Model Runner V1"
    engine: Engine
    policies: tuple[str, ...]  # built-in policy names, oldest release first
    built_in: Callable  # name -> Policy
    # The first and last release (major, minor) that ship this runner; None: not removed yet.
    first_release: tuple[int, int]
    last_release: tuple[int, int] | None
    release_policy: Callable[[tuple[int, int]], str]  # a release this family ships -> built-in policy name
    # -- real side: vLLM's code, in the release's environment -------------------------------------
    corpus: Callable  # policy -> the generated traces (Iterator[Trace]) the conformance run replays
    conform: Callable  # (version, policy, [(trace, source)], corpus) -> ConformanceRun
    session: Callable  # () -> a replay session: .replay(scenario, events) -> observed steps
    descriptor_from_json: Callable  # (observed batch descriptor, runtime mode) -> the runner's descriptor
    # (scenario, version) -> whether the release's profile_cudagraph_memory returns 0 by design there,
    # so that capture_model's graphs are accounted elsewhere (P10 does not judge them)
    profiling_skipped: Callable
    replays: tuple[str, ...]  # the vLLM modules whose code the replay runs, as dotted names
    # -- tree side: a vLLM source tree (--vllm-src) ------------------------------------------------
    markers: tuple[str, ...]  # files under vllm/ whose presence means a tree has this runner
    read_tree: Callable  # (package dir, given path, as_policy) -> Branch
    reads: tuple[tuple[str, str], ...]  # (file under vllm/, function) whose statements read_tree reads
    # -- capture sizes (contract/core/sizes.py); None where the family does not model them --------
    sizes: SizeModel | None = None

    def ships(self, release: tuple[int, int]) -> bool:
        return release >= self.first_release and (self.last_release is None or release <= self.last_release)
