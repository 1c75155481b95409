"""Whether a model architecture has an active ``@support_torch_compile`` submodule, read from a vLLM
release's source without importing it.

MRV2 decides whether the target can capture PIECEWISE with ``has_compiled_submodule(model)``
(``34:v1/worker/gpu/cudagraph_utils.py:145-151``: any submodule that is a
``TorchCompileWithNoGuardsWrapper`` with ``do_not_compile`` False), and does not ask it of the draft
model at all (spec §10, lead L2). ``do_not_compile`` is set in the decorator's ``__init__``
(``34:compilation/decorators.py:408-416``): compilation mode NONE or STOCK_TORCH_COMPILE, the
class marked ``@ignore_torch_compile``, or its ``enable_if(vllm_config)`` false. So the scenario
settings ``model_compiled`` and ``draft_compiled`` are properties of the model class: whether
any class its construction reaches is decorated.

The closure is static and errs towards "compiled": every class or module-level function a
class's methods call, or pass as an argument, is followed (through ``from`` imports, relative
ones included, and base classes), whatever branch it is on. "not compiled" therefore means no
decorated class is reachable at all; a construction this reading cannot follow (a model built
from the registry at run time) makes the answer "unknown". The architectures come from the
registry's tables (``model_executor/models/registry.py``); which target architecture an MTP draft
is made from comes from ``SpeculativeConfig.hf_config_override`` (``config/speculative.py``).

``python -m contract.evidence.model_facts VERSION PATH/TO/vllm`` refreshes one release in
``model_facts.json`` beside this file.
"""

from __future__ import annotations

import ast
import json
import sys
from dataclasses import dataclass
from pathlib import Path

TABLE = Path(__file__).with_name("model_facts.json")
REGISTRY = "model_executor/models/registry.py"
SPECULATIVE = "config/speculative.py"
DECORATOR = "support_torch_compile"
IGNORE = "ignore_torch_compile"
# Tables of the registry whose architectures a reproduction may serve (targets) or draft with.
TARGET_TABLES = ("_TEXT_GENERATION_MODELS", "_MULTIMODAL_MODELS")
DRAFT_TABLE = "_SPECULATIVE_DECODING_MODELS"
# Where model classes live; the closure follows names into these packages only (see _scope).
MODEL_PACKAGES = ("vllm.model_executor.models", "vllm.models")
MODELS_DIR = "model_executor/models/"
# Calls that build a model chosen at run time: the static closure cannot follow them.
DYNAMIC = ("init_vllm_registered_model", "_get_model_cls", "get_model_cls", "resolve_model_cls")

COMPILED, CONDITIONAL, NOT_COMPILED, UNKNOWN = "compiled", "conditional", "not compiled", "unknown"


class _Modules:
    """Parsed modules of one vLLM tree by dotted name; names resolved through imports."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.trees: dict[str, tuple[ast.Module, bool] | None] = {}
        self.indexes: dict[str, dict[str, tuple]] = {}

    def rel(self, dotted: str) -> str:
        found = self.load(dotted)
        if found is None:
            return dotted
        _, package = found
        parts = dotted.split(".")[1:]
        return "/".join(parts) + ("/__init__.py" if package else ".py")

    def load(self, dotted: str) -> tuple[ast.Module, bool] | None:
        if dotted not in self.trees:
            self.trees[dotted] = None
            if dotted == "vllm" or dotted.startswith("vllm."):
                base = self.root.joinpath(*dotted.split(".")[1:])
                for path, package in ((base.with_suffix(".py"), False), (base / "__init__.py", True)):
                    if path.is_file():
                        try:
                            self.trees[dotted] = (ast.parse(path.read_text()), package)
                        except (SyntaxError, UnicodeDecodeError):
                            pass
                        break
        return self.trees[dotted]

    def _absolute(self, dotted: str, node: ast.ImportFrom) -> str | None:
        if not node.level:
            return node.module
        found = self.load(dotted)
        package = dotted if found and found[1] else dotted.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        return f"{package}.{node.module}" if node.module else package

    def index(self, dotted: str) -> dict[str, tuple]:
        """name -> ("def", node) | ("import", module, name) | ("alias", name), built once per module."""
        if dotted in self.indexes:
            return self.indexes[dotted]
        found = self.load(dotted)
        out: dict[str, tuple] = {}
        if found is not None:
            tree, _ = found
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom):
                    module = self._absolute(dotted, node)
                    for alias in node.names:
                        out.setdefault(alias.asname or alias.name, ("import", module, alias.name))
            for node in tree.body:
                if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                        and isinstance(node.value, ast.Name)):
                    out[node.targets[0].id] = ("alias", node.value.id)
            for node in tree.body:
                if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                    out[node.name] = ("def", node)
        self.indexes[dotted] = out
        return out

    def resolve(self, dotted: str, name: str, depth: int = 0):
        """``(kind, module, node)`` for a class or function ``name`` seen from ``dotted``."""
        if depth > 8:
            return None
        entry = self.index(dotted).get(name)
        if entry is None:
            return None
        if entry[0] == "def":
            node = entry[1]
            return ("class" if isinstance(node, ast.ClassDef) else "function"), dotted, node
        if entry[0] == "alias":
            return None if entry[1] == name else self.resolve(dotted, entry[1], depth + 1)
        _, module, original = entry
        if not module or not module.startswith("vllm"):
            return None
        return self.resolve(module, original, depth + 1)


def _decorator(node: ast.ClassDef, name: str) -> ast.expr | None:
    for d in node.decorator_list:
        f = d.func if isinstance(d, ast.Call) else d
        if (isinstance(f, ast.Name) and f.id == name) or (isinstance(f, ast.Attribute) and f.attr == name):
            return d
    return None


def _enable_if(d: ast.expr) -> str | None:
    if isinstance(d, ast.Call):
        for kw in d.keywords:
            if kw.arg == "enable_if":
                return ast.unparse(kw.value)
    return None


@dataclass(frozen=True)
class Decorated:
    cls: str  # module.Class
    where: str  # path:line of the class, relative to vllm/
    enable_if: str | None  # the decorator's enable_if, None when it always compiles

    def text(self) -> str:
        """``module.Class (path:line)``, both relative to ``model_executor/models`` where they are in it."""
        where = self.where.removeprefix(MODELS_DIR)
        return f"{short(self.cls)} ({where})" + (f" enable_if={self.enable_if}" if self.enable_if else "")


@dataclass(frozen=True)
class ModelCompile:
    """What the static closure of one architecture's class finds."""

    arch: str
    cls: str  # module.Class the registry names
    status: str  # COMPILED, CONDITIONAL (every decorated class has an enable_if), NOT_COMPILED, UNKNOWN
    decorated: tuple[str, ...]  # Decorated.text() of each decorated class reached
    dynamic: tuple[str, ...]  # run-time constructions the closure could not follow

    def to_json(self) -> list:
        return [short(self.cls), self.status, list(self.decorated), list(self.dynamic)]

    @staticmethod
    def where(text: str) -> str:
        """``path:line`` (relative to ``vllm/``) of one of ``decorated``: a path that does not start
        with ``models/`` (the ``vllm.models`` package) is under ``model_executor/models/``."""
        where = text.partition("(")[2].partition(")")[0]
        return where if where.startswith("models/") else MODELS_DIR + where


def short(dotted: str) -> str:
    prefix = MODEL_PACKAGES[0] + "."
    return dotted[len(prefix):] if dotted.startswith(prefix) else dotted


def long(name: str) -> str:
    return name if name.startswith("vllm.") else f"{MODEL_PACKAGES[0]}.{name}"


def _names_used(fn: ast.AST) -> list[str]:
    """Every name a function body or class body reads: a class may be called, passed as a factory
    or kept as a class attribute (``model_cls = DeepseekV2Model``) and called through it."""
    return [n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]


class _Closure:
    """The decorated classes and run-time constructions reachable from a class, over one graph of
    every class and function the roots reach, its strongly connected components collapsed so that
    each is summed once (a per-root walk costs seconds per architecture)."""

    def __init__(self, modules: _Modules, scope: tuple[str, ...] = MODEL_PACKAGES) -> None:
        import networkx as nx

        self.modules = modules
        self.scope = scope
        self.graph = nx.DiGraph()
        self.own: dict[tuple, tuple[Decorated | None, frozenset]] = {}
        self.summary: dict[tuple, tuple[frozenset, frozenset]] | None = None

    def _expand(self, vertex: tuple, found) -> None:
        kind, module, node = found
        ignored = vertex[2]
        decorated, dynamic, edges = None, set(), []
        bodies: list[ast.AST] = [node]
        if kind == "class":
            d = _decorator(node, DECORATOR)
            if d is not None and not ignored:
                decorated = Decorated(f"{module}.{node.name}", f"{self.modules.rel(module)}:{node.lineno}", _enable_if(d))
            # The decorator patches the class itself, so a subclass inherits it unless it is marked
            # @ignore_torch_compile (``compilation/decorators.py``: ``_should_ignore_torch_compile``).
            base_ignored = ignored or _decorator(node, IGNORE) is not None
            for base in node.bases:
                if isinstance(base, ast.Name):
                    b = self.modules.resolve(module, base.id)
                    if b is not None and b[0] == "class":
                        edges.append((b, base_ignored))
            bodies = list(node.body)
        for body in bodies:
            for name in _names_used(body):
                if name in DYNAMIC:
                    dynamic.add(f"{name} in {short(module)}.{node.name}")
                    continue
                target = self.modules.resolve(module, name)
                if target is not None and target[1].startswith(self.scope):
                    edges.append((target, False))
        self.own[vertex] = (decorated, frozenset(dynamic))
        for target, flag in edges:
            child = (target[1], target[2].name, flag)
            self.graph.add_edge(vertex, child)
            self.pending.append((child, target))

    def add(self, dotted: str, name: str) -> tuple | None:
        """Explore from a root; its vertex, or None when the name does not resolve."""
        found = self.modules.resolve(dotted, name)
        if found is None:
            return None
        root = (found[1], found[2].name, False)
        self.graph.add_node(root)
        self.pending = [(root, found)]
        while self.pending:
            vertex, item = self.pending.pop()
            if vertex not in self.own:
                self._expand(vertex, item)
        self.summary = None
        return root

    def of(self, vertex: tuple) -> tuple[list[Decorated], list[str]]:
        import networkx as nx

        if self.summary is None:
            dag = nx.condensation(self.graph)
            sums: dict[int, tuple[frozenset, frozenset]] = {}
            for c in reversed(list(nx.topological_sort(dag))):
                decorated, dynamic = set(), set()
                for v in dag.nodes[c]["members"]:
                    d, dy = self.own.get(v, (None, frozenset()))
                    if d is not None:
                        decorated.add(d)
                    dynamic |= dy
                for succ in dag.successors(c):
                    decorated |= sums[succ][0]
                    dynamic |= sums[succ][1]
                sums[c] = (frozenset(decorated), frozenset(dynamic))
            mapping = dag.graph["mapping"]
            self.summary = {v: sums[mapping[v]] for v in self.graph.nodes}
        decorated, dynamic = self.summary[vertex]
        return sorted(decorated, key=lambda c: c.cls), sorted(dynamic)


def _scope(root: Path) -> tuple[str, ...]:
    """The model packages, plus the module of any decorated class elsewhere (none in 0.29.0 to
    0.34.0): a text search finds the files that name the decorator, and only they are parsed."""
    extra = []
    for path in sorted(Path(root).rglob("*.py")):
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError):
            continue
        if DECORATOR not in text:
            continue
        dotted = ".".join(("vllm", *path.relative_to(root).with_suffix("").parts))
        if dotted.endswith(".__init__"):
            dotted = dotted[: -len(".__init__")]
        if dotted.startswith(MODEL_PACKAGES):
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        if any(isinstance(n, ast.ClassDef) and _decorator(n, DECORATOR) for n in ast.walk(tree)):
            extra.append(dotted)
    return (*MODEL_PACKAGES, *extra)


def _status(decorated: list[Decorated], dynamic: list[str]) -> str:
    if any(c.enable_if is None for c in decorated):
        return COMPILED
    if decorated:
        return CONDITIONAL
    return UNKNOWN if dynamic else NOT_COMPILED


def _registry_tables(modules: _Modules) -> dict[str, dict[str, tuple[str, str]]]:
    found = modules.load("vllm." + REGISTRY[:-3].replace("/", "."))
    if found is None:
        raise FileNotFoundError(f"{modules.root}/{REGISTRY} not found: give the installed vllm package directory")
    tables = {}
    for node in found[0].body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Dict):
            rows = {}
            for k, v in zip(node.value.keys, node.value.values):
                if (isinstance(k, ast.Constant) and isinstance(v, ast.Tuple) and len(v.elts) == 2
                        and all(isinstance(e, ast.Constant) for e in v.elts)):
                    rows[k.value] = (v.elts[0].value, v.elts[1].value)
            tables[target.id] = rows
    return tables


def _module_name(rel: str) -> str:
    """``_resolve_module_name`` (``34:model_executor/models/registry.py:1651-1657``)."""
    return rel if rel.startswith("vllm.") else f"vllm.model_executor.models.{rel}"


def read_mtp_sources(vllm_root: Path) -> dict[str, list[str]]:
    """MTP draft architecture -> the target architectures / model types ``hf_config_override``
    rewrites into it (the string constants of the ``if`` tests that lead to its assignment)."""
    tree = ast.parse((Path(vllm_root) / SPECULATIVE).read_text())
    fn = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "hf_config_override"), None)
    out: dict[str, set[str]] = {}
    if fn is None:
        return {}
    aliases: dict[str, set[str]] = {}  # model_type a test rewrites into -> the strings that test named

    def strings(node: ast.AST) -> set[str]:
        return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}

    def archs(node: ast.AST) -> set[str]:
        found = set()
        for d in ast.walk(node):
            if isinstance(d, ast.Dict):
                for k, v in zip(d.keys, d.values):
                    if isinstance(k, ast.Constant) and k.value == "architectures":
                        found |= strings(v)
            if isinstance(d, ast.Dict) is False and isinstance(d, ast.Assign):
                pass
        return found

    for node in ast.walk(fn):
        if not isinstance(node, ast.If):
            continue
        tested = strings(node.test) - {"architectures", "model_type"}
        for s in node.body:
            # ``hf_config.model_type = "x_mtp"`` under a test: x_mtp stands for what the test named
            if (isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Attribute)
                    and s.targets[0].attr == "model_type" and isinstance(s.value, ast.Constant)):
                aliases.setdefault(s.value.value, set()).update(tested)
        body_archs = set()
        for s in node.body:
            body_archs |= archs(s)
        for arch in body_archs:
            named = set()
            for t in tested:
                named |= aliases.get(t, set()) or {t}
            out.setdefault(arch, set()).update(named or tested)
    return {k: sorted(v) for k, v in sorted(out.items())}


@dataclass(frozen=True)
class ModelFacts:
    release: str
    targets: tuple[ModelCompile, ...]  # text-generation and multimodal architectures
    drafts: tuple[ModelCompile, ...]  # _SPECULATIVE_DECODING_MODELS
    mtp_sources: tuple[tuple[str, tuple[str, ...]], ...]  # MTP draft arch -> target arch / model types

    def model(self, arch: str) -> ModelCompile | None:
        return next((m for m in (*self.drafts, *self.targets) if m.arch == arch), None)

    def draft(self, arch: str) -> ModelCompile | None:
        return next((m for m in self.drafts if m.arch == arch), None)

    def target(self, arch: str) -> ModelCompile | None:
        return next((m for m in self.targets if m.arch == arch), None)


def read(release: str, vllm_root: Path, archs: set[str] | None = None) -> ModelFacts:
    """The facts of every architecture of the registry's tables, or of ``archs`` only."""
    modules = _Modules(Path(vllm_root))
    tables = _registry_tables(modules)
    closure = _Closure(modules, _scope(Path(vllm_root)))

    roots: dict[str, dict[str, tuple[str, tuple | None]]] = {}
    for table in (*TARGET_TABLES, DRAFT_TABLE):
        for arch, (rel, cls) in tables.get(table, {}).items():
            if archs is not None and arch not in archs:
                continue
            module = _module_name(rel)
            roots.setdefault(table, {})[arch] = (f"{module}.{cls}", closure.add(module, cls))

    def rows(names) -> tuple[ModelCompile, ...]:
        out = {}
        for table in names:
            for arch, (cls, vertex) in roots.get(table, {}).items():
                if vertex is None:
                    out[arch] = ModelCompile(arch, cls, UNKNOWN, (), (f"{short(cls)} not found",))
                    continue
                decorated, dynamic = closure.of(vertex)
                out[arch] = ModelCompile(arch, cls, _status(decorated, dynamic),
                                         tuple(c.text() for c in decorated), tuple(dynamic))
        return tuple(out[a] for a in sorted(out))

    mtp = read_mtp_sources(vllm_root)
    return ModelFacts(release, rows(TARGET_TABLES), rows((DRAFT_TABLE,)),
                      tuple((k, tuple(v)) for k, v in mtp.items()))


def to_json(facts: ModelFacts) -> dict:
    return {"targets": {m.arch: m.to_json() for m in facts.targets},
            "drafts": {m.arch: m.to_json() for m in facts.drafts},
            "mtp_sources": {k: list(v) for k, v in facts.mtp_sources}}


def _rows(data: dict) -> tuple[ModelCompile, ...]:
    return tuple(ModelCompile(arch, long(cls), status, tuple(decorated), tuple(dynamic))
                 for arch, (cls, status, decorated, dynamic) in data.items())


def dumps(data: dict) -> str:
    """One line per architecture: the table is read by people as well as by code."""
    lines = ["{"]
    releases = sorted(data)
    for i, release in enumerate(releases):
        lines.append(f" {json.dumps(release)}: {{")
        parts = list(data[release].items())
        for j, (key, rows) in enumerate(parts):
            lines.append(f"  {json.dumps(key)}: {{")
            items = list(rows.items())
            for k, (name, row) in enumerate(items):
                lines.append(f"   {json.dumps(name)}: {json.dumps(row)}" + ("," if k < len(items) - 1 else ""))
            lines.append("  }" + ("," if j < len(parts) - 1 else ""))
        lines.append(" }" + ("," if i < len(releases) - 1 else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


def committed() -> dict[str, ModelFacts]:
    """The committed facts: release -> facts."""
    out = {}
    for release, data in json.loads(TABLE.read_text()).items():
        out[release] = ModelFacts(release, _rows(data["targets"]), _rows(data["drafts"]),
                                  tuple((k, tuple(v)) for k, v in data["mtp_sources"].items()))
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m contract.evidence.model_facts VERSION PATH/TO/site-packages/vllm", file=sys.stderr)
        return 2
    release, root = argv
    try:
        facts = read(release, Path(root))
    except (OSError, SyntaxError, ValueError) as exc:
        print(f"error: cannot read vLLM {release}'s source at {root}: {exc}", file=sys.stderr)
        return 2
    data = json.loads(TABLE.read_text()) if TABLE.exists() else {}
    data[release] = to_json(facts)
    from contract.core.output import write_atomic

    write_atomic(TABLE, dumps(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
