"""Which decision points of each replayed step were made by vLLM's code and which by the harness.

A decision point is a function whose outcome shapes the observation: vLLM's runner steps
(``_dummy_run``, ``capture_model``, ...), the dispatchers, the forward context, the wrappers'
``__call__``, and the harness's own glue where it mirrors vLLM's lines. Each is tracked by a
pass-through shim that notes its name in the current step; who made it is read from where its code
lives (``co_filename`` under the installed ``vllm`` package, or the harness's own file), never
declared. The log counts, per event kind and point, the steps in which the point was made, and keeps,
for the trace being replayed, the points each step reached in the order first reached (its
*path*). Where a point's code lives (the file under the ``vllm`` package and the line range of
its function) is read from the code object and the file's ``ast`` when the point is tracked
(``where``), so a report cites the installed release's own lines.

Every point the harness mirrors is listed in ``MIRRORED`` with the vLLM statements it mirrors,
found by ``ast`` in each supported release's source and hashed; ``tests/test_decisions.py`` fails
when a release's statements differ from the recorded digest, i.e. when vLLM changes what the
harness mirrors.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

VLLM = "vLLM"
HARNESS = "harness"
# The scenario's VllmConfig, built by vLLM's __post_init__: a trace's path entry before its first event.
CONFIG_POINT = "VllmConfig.__post_init__"
CONFIG_STEP = "config"


def owner(function) -> str:
    code = getattr(inspect.unwrap(function), "__code__", None)
    filename = code.co_filename if code is not None else ""
    return VLLM if "/vllm/" in filename.replace("\\", "/") else HARNESS


def package_path(filename: str | Path) -> str:
    """``filename`` relative to the ``vllm`` package folder holding it: the installed release's, or
    a source tree's whose modules ``--vllm-src`` puts in their place."""
    parts = Path(filename).resolve().parts
    top = len(parts) - 1 - parts[::-1].index("vllm") if "vllm" in parts else 0
    return "/".join(parts[top + 1:])


def _vllm_package() -> Path | None:
    try:
        import vllm
    except ImportError:
        return None
    return Path(vllm.__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def _functions(filename: str) -> dict[tuple[str, int], tuple[int, int]]:
    """(name, first line of the def or its first decorator) -> (that line, last line)."""
    try:
        tree = ast.parse(Path(filename).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            out[(node.name, first)] = (first, node.end_lineno or node.lineno)
    return out


def where(function, name: str | None = None, package: Path | None = None) -> dict | None:
    """Where ``function``'s code lives in the installed ``vllm`` package: ``{"function", "path",
    "lines"}`` with ``path`` relative to the package (default: the imported ``vllm``) and ``lines``
    the first (decorators included) and last line of its ``def``, found by ``ast`` at the code
    object's ``co_firstlineno``; None for code outside the package."""
    code = getattr(inspect.unwrap(function), "__code__", None)
    package = package or _vllm_package()
    if code is None or package is None:
        return None
    filename = Path(code.co_filename).resolve()
    if not filename.is_relative_to(package):
        return None
    span = _functions(str(filename)).get((code.co_name, code.co_firstlineno))
    if span is None:
        return None
    return {"function": name or getattr(code, "co_qualname", code.co_name),
            "path": filename.relative_to(package).as_posix(), "lines": list(span)}


# point -> where its code lives (``where``; for a mirrored point, the statements it mirrors),
# filled as points are tracked.
WHERE: dict[str, dict] = {}


@dataclass
class Log:
    current: dict[str, str] = field(default_factory=dict)  # point -> owner, this step
    steps: Counter = field(default_factory=Counter)  # (event kind, point, owner) -> steps
    path: list[dict] = field(default_factory=list)  # the trace being replayed: {"event", "points"} per step

    def note(self, point: str, who: str) -> None:
        self.current.setdefault(point, who)

    def close_step(self, kind: str) -> None:
        for point, who in self.current.items():
            self.steps[(kind, point, who)] += 1
        self.path.append({"event": kind, "points": list(self.current)})
        self.current = {}

    def start_trace(self) -> None:
        self.current, self.path = {}, []

    def to_json(self) -> list[dict]:
        return [{"event": kind, "point": point, "owner": who, "steps": n}
                for (kind, point, who), n in sorted(self.steps.items())]


LOG: Log | None = None


def note(point: str, function, name: str | None = None) -> None:
    """``point`` reached in the current step by vLLM's ``function`` (called outside any shim)."""
    found = where(function, name)
    if found is not None:
        WHERE.setdefault(point, {"owner": VLLM, **found})
    if LOG is not None:
        LOG.note(point, owner(function))


def tracked(function, point: str, location: dict | None = None):
    """``function`` noting ``point`` in the current step each time it is called; ``location``
    (``where``'s form) for code whose ``def`` is not in vLLM's source (a block cut from a method)."""
    if getattr(function, "__decision_point__", None):
        return function
    if isinstance(function, staticmethod):
        return staticmethod(tracked(function.__func__, point, location))
    who = owner(function)
    found = location or (where(function) if who == VLLM else None)
    if found is not None:
        WHERE.setdefault(point, {"owner": who, **found})

    @functools.wraps(function)
    def shim(*args, **kwargs):
        if LOG is not None:
            LOG.note(point, who)
        return function(*args, **kwargs)

    shim.__decision_point__ = point
    return shim


def track_attribute(holder, name: str, point: str | None = None, location: dict | None = None) -> None:
    """Replace ``holder.name`` (a module global or a class attribute) by its tracked shim."""
    if isinstance(holder, type):
        raw = next(klass.__dict__[name] for klass in holder.__mro__ if name in klass.__dict__)
    else:
        raw = getattr(holder, name)
    setattr(holder, name, tracked(raw, point or name, location))


def share(entries: list[dict]) -> float | None:
    total = sum(e["steps"] for e in entries)
    return sum(e["steps"] for e in entries if e["owner"] == VLLM) / total if total else None


# -- mirrored points and their guards ---------------------------------------------------------

def _calls(node: ast.AST, attribute: str) -> bool:
    return any(isinstance(n, ast.Call) and (
        (isinstance(n.func, ast.Attribute) and n.func.attr == attribute)
        or (isinstance(n.func, ast.Name) and n.func.id == attribute)) for n in ast.walk(node))


def _method(tree: ast.Module, class_name: str, method: str) -> ast.FunctionDef:
    """``class_name.method``, or the module-level function ``method`` when ``class_name`` is empty."""
    for node in tree.body:
        if not class_name and isinstance(node, ast.FunctionDef) and node.name == method:
            return node
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    return item
    raise LookupError(f"no {class_name + '.' if class_name else ''}{method}")


def _mirrored_nodes(function: ast.FunctionDef, assigned_from: tuple[str, ...], context_call: str,
                    starts: tuple[str, ...] = ()) -> list[ast.AST]:
    """The assignments whose value calls one of ``assigned_from``, the ``context_call(...)``
    calls of ``with`` items, and the statements of the function's own body whose source starts
    with one of ``starts``, in source order."""
    out: list[ast.AST] = [stmt for stmt in function.body if starts and ast.unparse(stmt).startswith(starts)]
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and any(_calls(node.value, name) for name in assigned_from):
            out.append(node)
        elif isinstance(node, ast.With) and context_call:
            out += [item.context_expr for item in node.items if _calls(item.context_expr, context_call)
                    and isinstance(item.context_expr, ast.Call)
                    and getattr(item.context_expr.func, "id", None) == context_call]
    return sorted(out, key=lambda n: (n.lineno, n.col_offset))


@dataclass(frozen=True)
class Mirrored:
    """A harness function mirroring vLLM statements, found in ``path`` (relative to the vllm
    package) inside ``class_name.method``."""

    point: str
    path: str
    class_name: str  # "" for a module-level function
    method: str
    digests: dict  # release -> sha256 of the mirrored statements' ast.dump (Python 3.11 and 3.12)
    assigned_from: tuple[str, ...] = ()
    context_call: str = ""
    starts: tuple[str, ...] = ()  # top-level statements of the method, by how their source starts
    runner: str = "MRV1"  # the replay whose harness mirrors it: MRV1 or MRV2

    def nodes(self, source: str) -> list[ast.AST]:
        return _mirrored_nodes(_method(ast.parse(source), self.class_name, self.method),
                               self.assigned_from, self.context_call, self.starts)

    def known(self, version: str, vllm_package: Path) -> bool:
        return self.digests.get(version) == self.digest(vllm_package)

    def digest(self, vllm_package: Path) -> str:
        nodes = self.nodes((vllm_package / self.path).read_text(encoding="utf-8"))
        return hashlib.sha256("\n".join(ast.dump(n) for n in nodes).encode()).hexdigest()

    def location(self, vllm_package: Path) -> dict | None:
        """``where``'s form for the mirrored statements: the first to the last line they span."""
        try:
            nodes = self.nodes((vllm_package / self.path).read_text(encoding="utf-8"))
        except (OSError, LookupError, SyntaxError):
            return None
        if not nodes:
            return None
        return {"function": f"{self.class_name}.{self.method}", "path": self.path,
                "lines": [min(n.lineno for n in nodes), max(n.end_lineno or n.lineno for n in nodes)]}


MIRRORED = (
    Mirrored(
        point="compile: split the graph at the splitting ops",
        path="compilation/backends.py", class_name="VllmBackend", method="__call__",
        assigned_from=("split_graph",), context_call="",
        digests={"0.29.0": "81f1f7d791490b74982183358910496449514844317dbb24b01a4ee0f0e9b558",
                 "0.30.0": "81f1f7d791490b74982183358910496449514844317dbb24b01a4ee0f0e9b558"},
    ),
    Mirrored(
        point="execute_model: batch to dispatch, forward",
        path="v1/worker/gpu_model_runner.py", class_name="GPUModelRunner", method="execute_model",
        assigned_from=("_determine_batch_execution_and_padding", "maybe_create_ubatch_slices"),
        context_call="set_forward_context",
        digests={"0.29.0": "3e006cbb19cb4bc63f6526b9e36742be07a65ce4caf8955e029586b365adfb44",
                 "0.30.0": "3e006cbb19cb4bc63f6526b9e36742be07a65ce4caf8955e029586b365adfb44"},
    ),
    Mirrored(
        point="propose: dispatch, forward",
        path="v1/spec_decode/llm_base_proposer.py", class_name="SpecDecodeBaseProposer", method="propose",
        assigned_from=("_determine_batch_execution_and_padding",),
        context_call="set_forward_context",
        digests={"0.29.0": "0bfd6f90f2fce1083a95e48ee459d6a59e57d0652aaa3c1002f47864536155f0",
                 "0.30.0": "0bfd6f90f2fce1083a95e48ee459d6a59e57d0652aaa3c1002f47864536155f0"},
    ),
)

# Model Runner V2 (``contract/runners/mrv2/real/``): the scheduler's side of a step. The replay has
# no scheduler, so the harness writes a trace event as the ``SchedulerOutput`` and request states
# that ``execute_model`` and ``gather_batch_req_state`` read (``model_runner.scheduled_batch``:
# a uniform decode as running requests of ``q`` tokens, any other batch as prefilling requests),
# and ``profile_run``'s dummy batch as its counts; vLLM's code computes the dispatch's inputs from
# them. The guarded statements are the reads that make such a batch a decode or a prefill.
MRV2_BATCH = "scheduler: the step's batch (requests, their state)"
MIRRORED += (
    Mirrored(
        point=MRV2_BATCH, runner="MRV2",
        path="v1/worker/gpu/model_runner.py", class_name="GPUModelRunner", method="execute_model",
        starts=("num_reqs = len(scheduler_output", "num_toks = scheduler_output", "max_query_len",
                "batch_req_state, uniform_tok_count = ", "if batch_req_state is not None"),
        digests={"0.33.0": "9868c82beb125d40d984567c6f71a16fe621a300e43ae0f91d151ed891be113e",
                 "0.34.0": "4697f1f57e2bc60b444094a4c8459fe712586a138d0820594fa67101089891b7"},
    ),
    Mirrored(
        point=MRV2_BATCH, runner="MRV2",
        path="v1/worker/gpu/model_runner.py", class_name="GPUModelRunner", method="gather_batch_req_state",
        starts=("num_tokens_per_req = ", "num_reqs = ", "num_toks = ", "max_query_len = ", "if dummy_run:",
                "decode_graph_eligible = ", "return batch_state"),
        digests={"0.33.0": "e9e39c7a24025833c855c551f7533d1aa3133d2cd7df29a66c6cf6eae565384d",
                 "0.34.0": "e9e39c7a24025833c855c551f7533d1aa3133d2cd7df29a66c6cf6eae565384d"},
    ),
    Mirrored(
        point=MRV2_BATCH, runner="MRV2",
        path="v1/worker/utils.py", class_name="", method="get_uniform_decode_token_count",
        starts=("if ", "return "),
        digests={"0.33.0": "b33e7d747c29b8da8075737f304e7c5464ca26dd1f21f6eab83b3a5858a8581e",
                 "0.34.0": "b33e7d747c29b8da8075737f304e7c5464ca26dd1f21f6eab83b3a5858a8581e"},
    ),
)


# ``execute_model``'s micro-batch state, called by the replay on ``ubatch_utils.py``'s stand-in runner
# (the block tables and slot mappings it splits are the KV-cache plumbing the stand-in runner lacks).
MRV2_UBATCH_STATE = "execute_model: micro-batch state"
MIRRORED += (
    Mirrored(
        point=MRV2_UBATCH_STATE, runner="MRV2",
        path="v1/worker/gpu/model_runner.py", class_name="GPUModelRunner", method="execute_model",
        starts=("ubatch_state: UBatchState | None = None", "if batch_desc.num_ubatches > 1:"),
        digests={"0.33.0": "e3b771073505c96071196998898b03287af136a8a724f1c4afc0d45abdd2d8e7",
                 "0.34.0": "e7f246d25a733791ed8f41795e84fd78616334d3f09fb1667f328d46e058ba25"},
    ),
)


def mirrored_for(runner: str) -> tuple[Mirrored, ...]:
    return tuple(m for m in MIRRORED if m.runner == runner)
