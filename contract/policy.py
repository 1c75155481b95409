"""A policy: one vLLM revision's ``load_model`` wrapping rule, plus the revision-dependent facts
around it. Everything else the runner does is vLLM behaviour shared by the modelled revisions;
it is carried here as replaceable pure functions so a mutant can change exactly one of them.

Writing your own policy (a branch under review) takes one function::

    # my_branch.py
    from contract.api import *

    def load_model(ctx: LoadContext) -> Stacks:
        model, drafter = ctx.model, ctx.drafter_model
        if ctx.breakable and ctx.cudagraph_mode != NONE and not ctx.use_ubatching:
            model = BreakableCUDAGraphWrapper(model, runtime_mode=PIECEWISE)
            if drafter is not None:
                drafter = BreakableCUDAGraphWrapper(drafter, runtime_mode=PIECEWISE)
        if ctx.cudagraph_mode.has_full_cudagraphs() and not ctx.use_ubatching:
            model = CUDAGraphWrapper(model, runtime_mode=FULL)
        elif ctx.use_ubatching:
            model = UBatchWrapper(model, FULL if ctx.cudagraph_mode.has_full_cudagraphs() else NONE)
        return Stacks(model, drafter)

and ``cudagraph-contract verify --policy my_branch.py``. Optional module attributes:
``RUNNER`` (``Runner.MRV1``), ``CONFIG_REVISION`` (``ConfigRevision.V0_30``), ``DESCRIPTION``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from contract import dispatcher as _dispatcher
from contract import resolve as _resolve
from contract import scenario as _scenario
from contract.modes import NONE, CUDAGraphMode
from contract.scenario import ConfigRevision, Runner
from contract.stack import BreakableCUDAGraphWrapper, CUDAGraphWrapper, RawModel, Stacks


@dataclass(frozen=True)
class LoadContext:
    """What ``GPUModelRunner.load_model`` reads when it wraps (``gpu_model_runner.py:5128-5165``)."""

    cudagraph_mode: CUDAGraphMode  # self.compilation_config.cudagraph_mode at load time
    breakable: bool  # is_breakable_cudagraph_enabled()
    use_ubatching: bool  # self.parallel_config.use_ubatching
    model: RawModel  # self.model
    drafter_model: RawModel | None  # drafter.model when a drafter with a .model exists


def wrapper_acts(node: object, mode: CUDAGraphMode) -> bool:
    """The match rule of both wrapper classes (``cuda_graph.py:246-256``,
    ``breakable_cudagraph.py:329-333``)."""
    if mode == NONE:
        return False
    if isinstance(node, CUDAGraphWrapper):
        return mode == node.runtime_mode
    if isinstance(node, BreakableCUDAGraphWrapper):
        return node.runtime_mode is None or mode == node.runtime_mode
    return False


def entry_key(kind: str, mode: CUDAGraphMode, batch_descriptor: object) -> object:
    """Both wrappers key entries by batch descriptor alone, not by mode (``cuda_graph.py:259-263``,
    ``breakable_cudagraph.py:337-343``)."""
    return batch_descriptor


@dataclass(frozen=True)
class Policy:
    name: str
    load_model: Callable[[LoadContext], Stacks]
    runner: Runner = Runner.MRV1
    config_revision: ConfigRevision = ConfigRevision.V0_30
    description: str = ""
    source: str = "built-in"
    # Shared vLLM behaviour (replaced only by mutants).
    normalise: Callable = _scenario.normalise
    resolve: Callable = _resolve.resolve_cudagraph_mode_and_sizes
    initialize_cudagraph_keys: Callable = _dispatcher.initialize_cudagraph_keys
    dispatch: Callable = _dispatcher.dispatch
    drafter_cudagraph_mode: Callable = _dispatcher.drafter_cudagraph_mode
    wrapper_acts: Callable = wrapper_acts
    entry_key: Callable = entry_key
    compile_at_first_forward: bool = True  # spec §5.1: Dynamo compiles at the first forward
    capture_model_closes_window: bool = True  # set_cudagraph_capturing_enabled(False), :6916

    @property
    def engine(self):
        from contract import runner

        return runner

    def mutate(self, name: str, description: str, **changes) -> Policy:
        return dataclasses.replace(self, name=name, description=description, **changes)


class PolicyError(Exception):
    """A policy name or file that cannot be used; the message says what to do."""


BUILT_IN = ("vllm_0_29", "pr56312_draft", "vllm_0_30", "mrv2_0_33", "mrv2_0_34")


def from_module(module, name: str, source: str) -> Policy:
    built = getattr(module, "POLICY", None)
    if built is not None and source == "built-in":
        return built  # an MRV2 release: contract.mrv2.policy.Mrv2Policy
    load_model = getattr(module, "load_model", None)
    if not callable(load_model):
        raise PolicyError(f"policy {source} defines no load_model(ctx) function; see the README's policy interface")
    runner = getattr(module, "RUNNER", Runner.MRV1)
    revision = getattr(module, "CONFIG_REVISION", ConfigRevision.V0_30)
    if not isinstance(runner, Runner) or not isinstance(revision, ConfigRevision):
        raise PolicyError(f"policy {source}: RUNNER must be a Runner and CONFIG_REVISION a ConfigRevision")
    doc = (getattr(module, "DESCRIPTION", None) or module.__doc__ or "").strip().splitlines()
    return Policy(
        name=name,
        load_model=load_model,
        runner=runner,
        config_revision=revision,
        description=doc[0] if doc else "",
        source=source,
    )


IMPORT_TIMEOUT_S = 10.0


class _ImportTimeout(BaseException):
    """Raised by SIGALRM inside a policy file's import; a BaseException so the file cannot catch it
    with ``except Exception``."""


def _import_timed_out(signum, frame):
    raise _ImportTimeout


def load_policy(spec: str) -> Policy:
    """A built-in name, or a path to a ``.py`` file defining ``load_model``."""
    if spec in BUILT_IN:
        module = importlib.import_module(f"contract.policies.{spec}")
        return from_module(module, spec, "built-in")
    path = Path(spec)
    if path.suffix != ".py":
        raise PolicyError(f"unknown policy {spec!r}: use one of {', '.join(BUILT_IN)} or a path to a .py file")
    if not path.is_file():
        raise PolicyError(f"policy file {spec} does not exist")
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    module_name = f"_contract_user_policy_{digest}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(loader_spec)
    # A policy file that never finishes importing would hang every command; SIGALRM interrupts it
    # (Unix, main thread only: elsewhere the import runs unguarded).
    guarded = hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
    if guarded:
        previous = signal.signal(signal.SIGALRM, _import_timed_out)
        signal.setitimer(signal.ITIMER_REAL, IMPORT_TIMEOUT_S)
    try:
        loader_spec.loader.exec_module(module)
    except _ImportTimeout:
        raise PolicyError(f"policy file {spec} did not finish importing within {IMPORT_TIMEOUT_S:g} s") from None
    except BaseException as exc:  # noqa: BLE001 - user code: report any failure as bad input
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise PolicyError(f"policy file {spec} failed to import: {type(exc).__name__}: {exc}") from None
    finally:
        if guarded:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    sys.modules.setdefault(module_name, module)
    return from_module(module, path.stem, str(path))
