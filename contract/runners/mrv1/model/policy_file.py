"""A policy file: a ``.py`` module defining ``load_model(ctx)``, read as an MRV1 ``Policy``.

The file runs only in a child process (``contract.core.child``): the child imports it and
evaluates ``load_model`` for every ``LoadContext`` the model can ask (``stack_table``), and the
parent builds the policy from the checked table. Whatever the file does, exiting, hanging, forking,
printing, returning something else, is one line naming the file and what ``load_model`` must
return; nothing of it reaches the tool's own process or output. Built-in policies are the project's
own modules and are imported as they are.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path

from contract.core import child
from contract.core.policy import PolicyError
from contract.core.scenario import ConfigRevision, Runner
from contract.runners.mrv1.model import stack_table

MAX_DESCRIPTION = 200


def _attribute_problem(runner: object, revision: object) -> str | None:
    """What is wrong with the module's optional attributes, or None."""
    if not isinstance(runner, Runner) or not isinstance(revision, ConfigRevision):
        return "RUNNER must be a Runner and CONFIG_REVISION a ConfigRevision"
    if runner is not Runner.MRV1:
        # MRV2 never wraps the model (v1/worker/gpu/model_runner.py:403,408 in 0.33.0).
        return ("a load_model policy is Model Runner V1; Model Runner V2 never wraps the model: verify an "
                "MRV2 branch with --vllm-src PATH")
    return None


def from_module(module, name: str, source: str):
    """A policy module of the project's own (a built-in policy)."""
    from contract.runners.mrv1.model.policy import Policy

    load_model = getattr(module, "load_model", None)
    if not callable(load_model):
        raise PolicyError(f"policy {source} defines no load_model(ctx) function; see the README's policy interface")
    runner = getattr(module, "RUNNER", Runner.MRV1)
    revision = getattr(module, "CONFIG_REVISION", ConfigRevision.V0_30)
    wrong = _attribute_problem(runner, revision)
    if wrong:
        raise PolicyError(f"policy {source}: {wrong}")
    doc = (getattr(module, "DESCRIPTION", None) or module.__doc__ or "").strip().splitlines()
    return Policy(name=name, load_model=load_model, runner=runner, config_revision=revision,
                  description=doc[0] if doc else "", source=source)


def built_in(name: str):
    """A built-in MRV1 policy: ``contract/runners/mrv1/model/policies/<name>.py``."""
    return from_module(importlib.import_module(f"contract.runners.mrv1.model.policies.{name}"), name, "built-in")


def load_file(spec: str):
    """A ``.py`` file defining ``load_model``, evaluated in a child (``evaluate``)."""
    from contract.runners.mrv1.model.policy import Policy

    path = Path(spec)
    try:
        is_dir, is_file = path.is_dir(), path.is_file()
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte
        raise PolicyError(f"policy file {spec!r} cannot be opened: {getattr(exc, 'strerror', None) or exc}") from None
    if is_dir:
        raise PolicyError(f"policy file {spec} is a folder; pass the .py file that defines load_model")
    if not is_file:
        raise PolicyError(f"policy file {spec} does not exist")
    must = f"a policy file defines load_model(ctx) returning {stack_table.RETURNS}"
    try:
        value = child.run("contract.runners.mrv1.model.policy_file:evaluate", {"path": str(path.resolve())},
                          what=f"policy file {spec}", timeout=child.time_limit()).value
    except child.ChildProblem as exc:
        raise PolicyError(f"{exc}; {must}") from None
    if not isinstance(value, dict):
        raise PolicyError(f"policy file {spec} reported no table; {must}")
    if "problem" in value:
        problem = value["problem"] if isinstance(value["problem"], str) else repr(value["problem"])
        raise PolicyError(f"policy file {spec}: {problem[:1000]}"
                          + ("" if value.get("attributes") else f"; {must}"))
    try:
        table = stack_table.from_json(value.get("table"), str(path))
        runner, revision = Runner(value.get("runner")), ConfigRevision[value.get("config_revision")]
        description = value.get("description")
        if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
            raise ValueError("a description that is not a short string")
    except (stack_table.TableError, ValueError, KeyError) as exc:
        raise PolicyError(f"policy file {spec} reported {exc}; {must}") from None
    return Policy(name=path.stem, load_model=table, runner=runner, config_revision=revision,
                  description=description, source=str(path))


# -- the child's side ----------------------------------------------------------------------------

def evaluate(payload: dict) -> dict:
    """In the child: import the file, check its interface, and evaluate ``load_model`` for every
    context. ``{"problem": one line}`` when something is wrong; else the table and attributes."""
    forked = child.refuse_forks()
    sys.dont_write_bytecode = True  # the person's folder gets no __pycache__ of ours
    path = payload["path"]
    module_name = f"_contract_user_policy_{hashlib.sha1(path.encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        return {"problem": "cannot be loaded as a Python module"}
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses in the file look their module up
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - named code: any failure is its message
        return {"problem": f"failed to import: {child.error_text(exc)}"}
    if forked():
        return {"problem": "forked a process at import; a policy file must not start processes"}
    load_model = getattr(module, "load_model", None)
    if not callable(load_model):
        return {"problem": "defines no load_model(ctx) function"}
    try:
        inspect.signature(load_model).bind(stack_table.contexts()[0])
    except TypeError:
        return {"problem": f"load_model{_signature(load_model)} cannot be called as load_model(ctx): it takes "
                           "the context alone"}
    except ValueError:  # no signature to read (a builtin): calling it says
        pass
    revision = getattr(module, "CONFIG_REVISION", ConfigRevision.V0_30)
    wrong = _attribute_problem(getattr(module, "RUNNER", Runner.MRV1), revision)
    if wrong:
        return {"problem": wrong, "attributes": True}
    description = getattr(module, "DESCRIPTION", None) or module.__doc__ or ""
    if not isinstance(description, str):
        return {"problem": "DESCRIPTION must be a string", "attributes": True}
    rows = []
    for ctx in stack_table.contexts():
        try:
            stacks = load_model(ctx)
        except BaseException as exc:  # noqa: BLE001
            return {"problem": f"load_model({stack_table.said(ctx)}) raised {child.error_text(exc)}"}
        if forked():
            return {"problem": "load_model forked a process; a policy file must not start processes"}
        try:
            rows.append(stack_table.to_json(stacks, ctx))
        except stack_table.TableError as exc:
            return {"problem": f"load_model({stack_table.said(ctx)}) returned {exc}"}
    first = description.strip().splitlines()
    return {"runner": Runner.MRV1.value, "config_revision": revision.name,
            "description": first[0][:MAX_DESCRIPTION] if first else "", "table": rows}


def _signature(function) -> str:
    try:
        return str(inspect.signature(function))
    except (TypeError, ValueError):
        return "(...)"
