"""A policy file: a ``.py`` module defining ``load_model(ctx)``, read as an MRV1 ``Policy``."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import signal
import sys
import threading
from pathlib import Path

from contract.core.policy import PolicyError
from contract.core.scenario import ConfigRevision, Runner
from contract.runners.mrv1.model.policy import Policy


def from_module(module, name: str, source: str) -> Policy:
    load_model = getattr(module, "load_model", None)
    if not callable(load_model):
        raise PolicyError(f"policy {source} defines no load_model(ctx) function; see the README's policy interface")
    runner = getattr(module, "RUNNER", Runner.MRV1)
    revision = getattr(module, "CONFIG_REVISION", ConfigRevision.V0_30)
    if not isinstance(runner, Runner) or not isinstance(revision, ConfigRevision):
        raise PolicyError(f"policy {source}: RUNNER must be a Runner and CONFIG_REVISION a ConfigRevision")
    if runner is not Runner.MRV1:
        # MRV2 never wraps the model (v1/worker/gpu/model_runner.py:403,408 in 0.33.0).
        raise PolicyError(f"policy {source}: a load_model policy is Model Runner V1; Model Runner V2 never wraps "
                          "the model: verify an MRV2 branch with --vllm-src PATH")
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


def built_in(name: str) -> Policy:
    """A built-in MRV1 policy: ``contract/runners/mrv1/model/policies/<name>.py``."""
    return from_module(importlib.import_module(f"contract.runners.mrv1.model.policies.{name}"), name, "built-in")


def load_file(spec: str) -> Policy:
    """A ``.py`` file defining ``load_model``."""
    path = Path(spec)
    try:
        is_dir, is_file = path.is_dir(), path.is_file()
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte
        raise PolicyError(f"policy file {spec!r} cannot be opened: {getattr(exc, 'strerror', None) or exc}") from None
    if is_dir:
        raise PolicyError(f"policy file {spec} is a folder; pass the .py file that defines load_model")
    if not is_file:
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
