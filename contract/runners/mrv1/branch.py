"""A vLLM source tree as a policy: ``cudagraph-contract verify --vllm-src PATH``.

The tree's ``GPUModelRunner.load_model`` wrapping block (``v1/worker/gpu_model_runner.py``, the
statements from ``cudagraph_mode = self.compilation_config.cudagraph_mode`` to the end:
``:5456-5495`` in 0.30.0, ``:5511-5541`` in 0.29.0) is read with ``conformance/wrapping.py``. A
block whose fingerprint is a known revision is verified as that revision's built-in policy. Any
other block is run as the policy itself: compiled as a function of ``self`` whose free names are
bound to adapters that build this project's stack nodes, and called on a stand-in runner for each
``LoadContext`` in a child process (``contract.core.child``), whose table of stacks
(``stack_table``) is the policy: the tree's code never runs in the tool's own process, and a block
that exits, hangs or forks is one line. Nothing is imported from the tree, so it needs no torch and
no installed vLLM.

What the block does not say is read from the same tree: whether ``CUDAGraphWrapper.unwrap``
(``compilation/cuda_graph.py:222-226``) and ``BreakableCUDAGraphWrapper.unwrap``
(``compilation/breakable_cudagraph.py:303-306``) recurse, whether ``BreakableCUDAGraphWrapper``
takes ``runtime_mode`` (``breakable_cudagraph.py:274-279``; 0.29.0's ``:268-272`` does not), and
the config revision (``VllmConfig._normalize_piecewise_cudagraph_mode``, ``config/vllm.py:1010``,
first in 0.30.0).
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import inspect
import types
from pathlib import Path

from contract.core import child
from contract.core.modes import CUDAGraphMode
from contract.core.tree_source import method as _method
from contract.core.tree_source import parse as _parse_file
from contract.core.policy import Branch, BranchError
from contract.core.scenario import ConfigRevision
from contract.runners.mrv1.model import stack_table
from contract.runners.mrv1.model import wrappers as stack
from contract.runners.mrv1.model.policy_file import built_in
from contract.runners.mrv1.real import wrapping

RUNNER_FILE = "v1/worker/gpu_model_runner.py"
CUDA_GRAPH_FILE = "compilation/cuda_graph.py"
BREAKABLE_FILE = "compilation/breakable_cudagraph.py"
UBATCH_FILE = "v1/worker/gpu_ubatch_wrapper.py"
CONFIG_FILE = "config/vllm.py"
FILES = (RUNNER_FILE, CUDA_GRAPH_FILE, BREAKABLE_FILE, UBATCH_FILE, CONFIG_FILE)  # what a tree must hold
# The wrappers' facts of the releases whose blocks ``wrapping.KNOWN_REVISIONS`` knows: whether
# CUDAGraphWrapper.unwrap, BreakableCUDAGraphWrapper.unwrap and UBatchWrapper.unwrap recurse, and
# whether the breakable wrapper takes ``runtime_mode`` (read from 0.29.0, 0.30.0 and 0.33.0).
RELEASE_FACTS = {"0.29.0": (False, False, False, False), "0.30.0": (True, True, True, False)}

# What verify --vllm-src reads of an MRV1 tree: (file, function) whose statements it reads.
READS = ((RUNNER_FILE, "GPUModelRunner.load_model"), (CUDA_GRAPH_FILE, "CUDAGraphWrapper.unwrap"),
         (BREAKABLE_FILE, "BreakableCUDAGraphWrapper.unwrap"), (BREAKABLE_FILE, "BreakableCUDAGraphWrapper.__init__"),
         (UBATCH_FILE, "UBatchWrapper.unwrap"),
         (CONFIG_FILE, "VllmConfig._normalize_piecewise_cudagraph_mode"))

# The free names of the wrapping block; each is bound below. A block reading any other name is
# refused rather than run against a guess.
BOUND = {"CUDAGraphMode", "CUDAGraphWrapper", "BreakableCUDAGraphWrapper", "UBatchWrapper",
         "is_breakable_cudagraph_enabled", "get_offloader"}


def unwrap_recurses(tree: ast.Module, cls: str) -> bool:
    """``unwrap`` calls ``.unwrap()`` on its runnable (0.30.0) instead of returning it (0.29.0)."""
    method = _method(tree, cls, "unwrap")
    return method is not None and any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "unwrap"
        for n in ast.walk(method))


def takes_runtime_mode(tree: ast.Module, cls: str) -> bool:
    init = _method(tree, cls, "__init__")
    return init is not None and any(a.arg == "runtime_mode" for a in init.args.args + init.args.kwonlyargs)


def config_revision(tree: ast.Module) -> ConfigRevision:
    has = any(isinstance(n, ast.FunctionDef) and n.name == "_normalize_piecewise_cudagraph_mode"
              for n in ast.walk(tree))
    return ConfigRevision.V0_30 if has else ConfigRevision.V0_29


def _free_names(statements: list[ast.stmt]) -> set[str]:
    loaded, stored = set(), {"self"}
    for node in ast.walk(ast.Module(body=statements, type_ignores=[])):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else stored).add(node.id)
    return loaded - stored - set(dir(builtins))


def _adapters(cuda_graph_recurses: bool, breakable_recurses: bool, breakable_runtime_mode: bool,
              ubatch_recurses: bool) -> dict:
    """vLLM's constructor signatures (``cuda_graph.py:178-184``, ``breakable_cudagraph.py:274-279``,
    ``gpu_ubatch_wrapper.py:66-72``) building ``contract.runners.mrv1.model.wrappers`` nodes; ``vllm_config`` and
    ``device`` are dropped, an argument the branch's class would refuse is a ``TypeError`` here too."""

    def CUDAGraphWrapper(runnable, vllm_config, runtime_mode, cudagraph_options=None):
        return stack.CUDAGraphWrapper(runnable, runtime_mode, recursive_unwrap=cuda_graph_recurses)

    if breakable_runtime_mode:
        def BreakableCUDAGraphWrapper(runnable, vllm_config, runtime_mode=None):
            return stack.BreakableCUDAGraphWrapper(runnable, runtime_mode, recursive_unwrap=breakable_recurses)
    else:
        def BreakableCUDAGraphWrapper(runnable, vllm_config):
            return stack.BreakableCUDAGraphWrapper(runnable, None, recursive_unwrap=breakable_recurses)

    def UBatchWrapper(runnable, vllm_config, runtime_mode, device):
        return stack.UBatchWrapper(runnable, runtime_mode, recursive_unwrap=ubatch_recurses)

    # get_offloader().post_init() (gpu_model_runner.py:5495) moves no graph-relevant state.
    offloader = types.SimpleNamespace(post_init=lambda: None)
    return {"CUDAGraphMode": CUDAGraphMode, "CUDAGraphWrapper": CUDAGraphWrapper,
            "BreakableCUDAGraphWrapper": BreakableCUDAGraphWrapper, "UBatchWrapper": UBatchWrapper,
            "get_offloader": lambda: offloader}


def check_calls(statements: list[ast.stmt], adapters: dict, where: str) -> None:
    """Every wrapper construction in the block binds to the branch's signature; a call its class
    would refuse (``runtime_mode=`` on 0.29.0's breakable wrapper) is reported before any run."""
    for node in ast.walk(ast.Module(body=statements, type_ignores=[])):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id.endswith("Wrapper"):
            try:
                inspect.signature(adapters[node.func.id]).bind(
                    *node.args, **{k.arg: k.value for k in node.keywords if k.arg})
            except TypeError as exc:
                raise BranchError(f"{where}: line {node.lineno}: {node.func.id}(...) does not match the "
                                  f"branch's class: {exc}") from None


def _compile(statements: list[ast.stmt], path: str) -> types.CodeType:
    """The block as ``def load_model_wrapping(self)``, as ``wrapping.load`` builds it."""
    function = ast.FunctionDef(
        name="load_model_wrapping",
        args=ast.arguments(posonlyargs=[], args=[ast.arg(arg="self")], vararg=None, kwonlyargs=[],
                           kw_defaults=[], kwarg=None, defaults=[]),
        body=statements, decorator_list=[], returns=None, type_params=[])
    ast.copy_location(function, statements[0])
    tree = ast.fix_missing_locations(ast.Module(body=[function], type_ignores=[]))
    namespace: dict = {}
    exec(compile(tree, path, "exec"), namespace)  # defines the function; runs none of the block
    return namespace["load_model_wrapping"].__code__


def block_table(payload: dict) -> dict:
    """In a child (``contract.core.child``): the tree's block run for every ``LoadContext``, as a
    table (``stack_table``); ``{"problem": one line}`` when it raises, forks or leaves no stack."""
    forked = child.refuse_forks()
    statements = wrapping.block_statements(payload["source"], payload["path"])
    code = _compile(statements, payload["path"])
    adapters = _adapters(*payload["facts"])
    rows = []
    for ctx in stack_table.contexts():
        # The stand-in runner holds what the block reads (GPUModelRunner.__init__, :551, :705-710);
        # a drafter without a .model (ngram) wraps like no drafter, so it is left out.
        runner = types.SimpleNamespace(
            compilation_config=types.SimpleNamespace(cudagraph_mode=ctx.cudagraph_mode),
            parallel_config=types.SimpleNamespace(use_ubatching=ctx.use_ubatching),
            vllm_config=None, device="cpu", model=ctx.model)
        if ctx.drafter_model is not None:
            runner.drafter = types.SimpleNamespace(model=ctx.drafter_model)
        # Fresh globals per call: is_breakable_cudagraph_enabled() answers for this context only.
        env = {**adapters, "__builtins__": builtins, "is_breakable_cudagraph_enabled": lambda: ctx.breakable}
        try:
            types.FunctionType(code, env)(runner)
        except BaseException as exc:  # noqa: BLE001 - the tree's code: any failure is its message
            return {"problem": f"raised {child.error_text(exc)} for {stack_table.said(ctx)}"}
        if forked():
            return {"problem": "forked a process; the wrapping block must not start processes"}
        drafter = getattr(runner, "drafter", None)
        try:
            rows.append(stack_table.to_json(stack.Stacks(runner.model, None if drafter is None else drafter.model), ctx))
        except stack_table.TableError as exc:
            return {"problem": f"left {exc} for {stack_table.said(ctx)}"}
    return {"table": rows}


def block_policy(source: str, path: str, name: str, facts: tuple[bool, bool, bool, bool], revision: ConfigRevision,
                 given: str, where: str):
    """The tree's block as a policy: its table, computed in a child from the tree's statements."""
    from contract.runners.mrv1.model.policy import Policy

    what = f"the load_model wrapping block {where}"
    try:
        value = child.run("contract.runners.mrv1.branch:block_table",
                          {"source": source, "path": path, "facts": list(facts)},
                          what=what, timeout=child.time_limit()).value
        if not isinstance(value, dict):
            raise child.ChildProblem(f"{what} reported no table")
        if "problem" in value:
            problem = value["problem"] if isinstance(value["problem"], str) else repr(value["problem"])
            raise child.ChildProblem(f"{what} {problem[:1000]}")
        table = stack_table.from_json(value.get("table"), path)
    except child.ChildProblem as exc:
        raise BranchError(f"{exc}; the block must leave self.model (and drafter.model) a wrapper stack") from None
    except stack_table.TableError as exc:
        raise BranchError(f"{what} reported {exc}") from None
    return Policy(name=name, load_model=table, config_revision=revision,
                  description=f"the load_model wrapping block of {path}, run as a policy", source=given)


def load(pkg: Path, given: Path, *, as_policy: bool = False) -> Branch:
    """The block of the tree whose ``vllm/`` package is ``pkg`` (given as ``given``) as a policy;
    ``as_policy`` runs a known block too instead of mapping it."""
    runner_path = str(pkg / RUNNER_FILE)
    source = (pkg / RUNNER_FILE).read_text(encoding="utf-8", errors="replace")
    try:
        statements = wrapping.block_statements(source, runner_path)
    except SyntaxError as exc:
        raise BranchError(f"{runner_path} cannot be parsed: {exc}") from None
    except wrapping.WrappingBlockNotFound as exc:
        raise BranchError(str(exc)) from None
    where = f"{runner_path}:{statements[0].lineno}-{statements[-1].end_lineno or statements[-1].lineno}"
    cuda_graph, breakable = _parse(pkg, CUDA_GRAPH_FILE), _parse(pkg, BREAKABLE_FILE)
    facts = (unwrap_recurses(cuda_graph, "CUDAGraphWrapper"), unwrap_recurses(breakable, "BreakableCUDAGraphWrapper"),
             takes_runtime_mode(breakable, "BreakableCUDAGraphWrapper"),
             unwrap_recurses(_parse(pkg, UBATCH_FILE), "UBatchWrapper"))
    revision = config_revision(_parse(pkg, CONFIG_FILE))
    rules = hashlib.sha256(repr((wrapping.digest(statements), facts, revision.value)).encode()).hexdigest()
    known = wrapping.KNOWN_REVISIONS.get(wrapping.digest(statements))
    if known is not None and facts != RELEASE_FACTS[known[0]]:
        known = None  # a release's block over wrappers that unwrap otherwise: not that release's rules
    if known is not None and not as_policy:
        release, policy_name = known
        return Branch(built_in(policy_name), where, release, given, pkg, rules)
    unknown = _free_names(statements) - BOUND
    if unknown:
        raise BranchError(f"{where}: the wrapping block reads {', '.join(sorted(unknown))}, "
                          "which --vllm-src does not model")
    check_calls(statements, _adapters(*facts), where)
    policy = block_policy(source, runner_path, f"branch@{given.resolve().name}", facts, revision, str(given), where)
    return Branch(policy, where, None, given, pkg, rules)


def _parse(pkg: Path, rel: str):
    return _parse_file(pkg, rel, f"alongside vllm/{RUNNER_FILE}")
