"""What a reproduction needs from a vLLM release's source: which attention backend gives which
``AttentionCGSupport``, and the attention ops ``splitting_ops`` must list.

``_check_and_update_cudagraph_mode`` resolves the mode against the minimum
``builder_cls.get_cudagraph_support(...)`` over the model's backends
(``v1/worker/gpu_model_runner.py:7249-7275`` in 0.29.0). This module reads, without importing vLLM,
each ``AttentionBackendEnum`` member (``v1/attention/backends/registry.py``), its
``get_builder_cls()`` and the builder's ``_cudagraph_support`` or ``get_cudagraph_support``
override, following base classes; and ``CompilationConfig._attention_ops``
(``config/compilation.py``), which ``splitting_ops_contain_attention()`` requires all of. The facts
are committed per release in ``release_facts.json`` beside this file (the reports are written where
vLLM is not installed); ``python -m contract.evidence.release_facts VERSION PATH/TO/vllm`` refreshes
one release.

A level the source decides at run time depends on the GPU: ``support_by_capability`` in the same
file holds, per release, NVIDIA dense backend and ``--attention-config``, the level the release's
own ``get_cudagraph_support`` returns at each compute capability (run on CPU by
``contract.evidence.engine_check --support-table VERSION``, which writes it), and
:func:`hardware` says it in GPU names.
"""

from __future__ import annotations

import ast
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

TABLE = Path(__file__).with_name("release_facts.json")
COMPILATION = "config/compilation.py"
REGISTRY = "v1/attention/backends/registry.py"
# The base builder's default (``v1/attention/backend.py``: ``_cudagraph_support = NEVER``).
BASE_BUILDER = "AttentionMetadataBuilder"


@dataclass(frozen=True)
class BackendSupport:
    backend: str  # AttentionBackendEnum member: the --attention-backend value
    class_name: str  # the backend class; resolve's messages name it (``attn_backend.__name__``)
    support: tuple[str, ...]  # the AttentionCGSupport members it can report
    condition: str  # "" when fixed; else which one, as vLLM's source decides it
    where: str  # path:line of the deciding assignment or method, relative to vllm/

    def gives(self, level: str) -> bool:
        return level in self.support


class _Source:
    """Parsed vLLM modules, by dotted name; classes found through ``from vllm.x import Name``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: dict[str, ast.Module | None] = {}

    def module(self, dotted: str) -> ast.Module | None:
        if dotted not in self.modules:
            path = self.path(dotted)
            self.modules[dotted] = ast.parse(path.read_text()) if path.exists() else None
        return self.modules[dotted]

    def path(self, dotted: str) -> Path:
        return self.root.joinpath(*dotted.split(".")[1:]).with_suffix(".py")

    def find_class(self, dotted: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef] | None:
        tree = self.module(dotted)
        if tree is None or depth > 5:
            return None
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return dotted, node
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vllm"):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return self.find_class(node.module, alias.name, depth + 1)
        return None


def _support_names(node: ast.AST) -> list[str]:
    names = []
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "AttentionCGSupport":
            if n.attr not in names:
                names.append(n.attr)
    return names


def _is_plain_getter(fn: ast.FunctionDef) -> bool:
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return (len(body) == 1 and isinstance(body[0], ast.Return) and isinstance(body[0].value, ast.Attribute)
            and body[0].value.attr == "_cudagraph_support")


def _returns_under(fn: ast.FunctionDef) -> list[str]:
    """``X when <test>`` for each ``return AttentionCGSupport.X`` nested in an ``if``."""
    out = []

    def visit(stmts, tests):
        for s in stmts:
            if isinstance(s, ast.If):
                visit(s.body, tests + [ast.unparse(s.test)])
                visit(s.orelse, tests + [f"not ({ast.unparse(s.test)})"])
            elif isinstance(s, ast.Return) and s.value is not None:
                for level in _support_names(s.value):
                    out.append(f"{level} when {' and '.join(tests)}" if tests else f"{level} otherwise")
            elif isinstance(s, (ast.For, ast.While, ast.With, ast.Try)):
                visit(getattr(s, "body", []), tests)

    visit(fn.body, [])
    return out


def _decide(src: _Source, dotted: str, cls: ast.ClassDef) -> tuple[tuple[str, ...], str, str] | None:
    """(levels, condition, where) from the first class in ``cls``'s bases that decides."""
    rel = src.path(dotted).relative_to(src.root).as_posix()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "get_cudagraph_support" and not _is_plain_getter(node):
            levels = _support_names(node)
            cond = "; ".join(_returns_under(node)) or "decided at run time"
            return tuple(levels), f"get_cudagraph_support: {cond}", f"{rel}:{node.lineno}"
    for node in cls.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "_cudagraph_support" and node.value is not None:
            value = node.value
            levels = _support_names(value)
            cond = ""
            if isinstance(value, ast.IfExp):
                cond = (f"{_support_names(value.body)[0]} when {ast.unparse(value.test)}, "
                        f"else {_support_names(value.orelse)[0]}")
            return tuple(levels), cond, f"{rel}:{node.lineno}"
    for base in cls.bases:
        name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
        found = src.find_class(dotted, name) if name else None
        if found is not None:
            decided = _decide(src, *found)
            if decided is not None:
                return decided
    return None


def read_attention_ops(vllm_root: Path) -> list[str]:
    """``CompilationConfig._attention_ops``, in source order."""
    tree = ast.parse((Path(vllm_root) / COMPILATION).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "_attention_ops":
            return [e.value for e in node.value.elts]
    raise ValueError(f"{vllm_root}/{COMPILATION} has no CompilationConfig._attention_ops")


def read_backends(vllm_root: Path) -> list[BackendSupport]:
    """Every backend of ``AttentionBackendEnum`` with a metadata builder, in enum order."""
    src = _Source(Path(vllm_root))
    registry = src.module("vllm." + REGISTRY[:-3].replace("/", "."))
    if registry is None:
        raise FileNotFoundError(f"{vllm_root}/{REGISTRY} not found: give the installed vllm package directory")
    enum = next(n for n in registry.body if isinstance(n, ast.ClassDef) and n.name == "AttentionBackendEnum")
    out = []
    for node in enum.body:
        if not (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str) and node.value.value):
            continue
        module, _, class_name = node.value.value.rpartition(".")
        found = src.find_class(module, class_name)
        if found is None:
            continue
        builder = _builder(src, *found)
        if builder is None:
            continue
        decided = _decide(src, *builder)
        if decided is not None:
            out.append(BackendSupport(node.targets[0].id, class_name, *decided))
    return out


def _builder(src: _Source, dotted: str, cls: ast.ClassDef) -> tuple[str, ast.ClassDef] | None:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "get_builder_cls":
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Name):
                    return src.find_class(dotted, ret.value.id)
    for base in cls.bases:
        if isinstance(base, ast.Name):
            found = src.find_class(dotted, base.id)
            if found is not None and found[1].name != "AttentionBackend":
                return _builder(src, *found)
    return None


def read_log_sites(vllm_root: Path) -> dict[str, str]:
    """``contract.evidence.logs.SITES`` key -> ``path:line`` of its template in this release."""
    from contract.evidence.logs import SITES

    out = {}
    for key, (path, fragment) in SITES.items():
        lines = (Path(vllm_root) / path).read_text().splitlines()
        hits = [i + 1 for i, line in enumerate(lines) if fragment in line]
        if len(hits) == 1:
            out[key] = f"{path}:{hits[0]}"
    return out


@dataclass(frozen=True)
class ReleaseFacts:
    release: str
    attention_backends: tuple[BackendSupport, ...]
    attention_ops: tuple[str, ...]
    log_sites: tuple[tuple[str, str], ...]  # (SITES key, path:line)

    def site(self, key: str) -> str | None:
        return dict(self.log_sites).get(key)


def read(release: str, vllm_root: Path) -> ReleaseFacts:
    return ReleaseFacts(release, tuple(read_backends(vllm_root)), tuple(read_attention_ops(vllm_root)),
                        tuple(sorted(read_log_sites(vllm_root).items())))


def to_json(facts: ReleaseFacts) -> dict:
    return {"attention_backends": [asdict(b) for b in facts.attention_backends],
            "attention_ops": list(facts.attention_ops), "log_sites": dict(facts.log_sites)}


# What ``support_by_capability`` evaluates: (backend, --attention-config, whether FlashInfer's
# TRT-LLM kernels are available: ``has_nvidia_artifactory()``, ``utils/flashinfer.py``; None where
# the backend does not ask). The reference model is Qwen/Qwen3-8B (head size 128, 32 query and 8 KV
# heads), the geometry of every dense checkpoint the reproductions use.
SUPPORT_VARIANTS = (
    ("FLASH_ATTN", {}, None),
    ("FLASH_ATTN", {"flash_attn_version": 2}, None),
    ("FLASHINFER", {}, True),
    ("FLASHINFER", {}, False),
    ("FLASHINFER", {"use_trtllm_attention": False}, None),
    ("TRITON_ATTN", {}, None),
    ("FLEX_ATTENTION", {}, None),
)
SUPPORT_MODEL = "Qwen/Qwen3-8B"
# Compute capability -> the NVIDIA data-centre and workstation GPUs that have it.
CAPABILITY_GPUS = {
    "8.0": "A100, A30", "8.6": "A10, A40, RTX A6000, RTX 30 series", "8.9": "L4, L40S, RTX 6000 Ada, RTX 40 series",
    "9.0": "H100, H200, GH200", "10.0": "B200, GB200", "10.3": "B300, GB300",
    "12.0": "RTX PRO 6000 Blackwell, RTX 50 series", "12.1": "DGX Spark (GB10)",
}


def variant_key(attention_config: dict, trtllm_cubins: bool | None) -> str:
    """``support_by_capability``'s key: "default" or the ``--attention-config`` JSON, and for
    FlashInfer's default whether its TRT-LLM kernels are available."""
    key = json.dumps(attention_config, sort_keys=True) if attention_config else "default"
    if trtllm_cubins is not None:
        key += ", TRT-LLM kernels " + ("available" if trtllm_cubins else "unavailable")
    return key


def support_by_capability(release: str) -> dict[str, dict[str, dict[str, str]]]:
    """backend -> variant key -> compute capability -> level, as committed; {} without it."""
    data = json.loads(TABLE.read_text()).get(release, {})
    return data.get("support_by_capability", {})


def adaptive_refused(release: str) -> dict[str, dict[str, list[str]]]:
    """backend -> variant key -> the compute capabilities on which vLLM refuses the backend for a
    model under adaptive verification (``engine_check.support_table``), as committed."""
    return json.loads(TABLE.read_text()).get(release, {}).get("adaptive_refused_by_capability", {})


def span(capabilities) -> str:
    """``9.0 and newer`` / ``8.0 to 8.9`` / ``every compute capability`` / a list, over the evaluated ones."""
    known = list(CAPABILITY_GPUS)
    caps = [c for c in known if c in set(capabilities)]
    if caps == known:
        return "every compute capability (8.0 to 12.1)"
    if caps and caps == known[known.index(caps[0]):]:
        return f"{caps[0]} and newer"
    if caps and caps == known[: len(caps)]:
        return f"{caps[0]} to {caps[-1]}"
    return ", ".join(caps)


def gpus(capabilities) -> str:
    """``9.0 and newer (H100, H200, GH200; B200, ...)``: the span and the GPUs in it."""
    caps = [c for c in CAPABILITY_GPUS if c in set(capabilities)]
    text = f"{caps[0]} to {caps[-1]}" if caps == list(CAPABILITY_GPUS) else span(caps)
    return f"{text} ({'; '.join(CAPABILITY_GPUS[c] for c in caps)})"


def hardware(release: str, backend: str) -> list[str]:
    """Per variant, which compute capabilities give which level:
    ``default: `UNIFORM_BATCH` on 8.0 to 8.9, `ALWAYS` on 9.0 ...``."""
    out = []
    for variant, levels in support_by_capability(release).get(backend, {}).items():
        by_level: dict[str, list[str]] = {}
        for cap, level in levels.items():
            by_level.setdefault(level, []).append(cap)
        parts = [f"`{level}` on {span(caps)}" for level, caps in by_level.items()]
        name = f"`--attention-config '{variant}'`" if variant.startswith("{") else variant
        out.append(f"{name}: " + ", ".join(parts))
    return out


def committed() -> dict[str, ReleaseFacts]:
    """The committed facts: release -> facts."""
    out = {}
    for release, data in json.loads(TABLE.read_text()).items():
        backends = tuple(BackendSupport(b["backend"], b["class_name"], tuple(b["support"]), b["condition"], b["where"])
                         for b in data["attention_backends"])
        out[release] = ReleaseFacts(release, backends, tuple(data["attention_ops"]),
                                    tuple(sorted(data["log_sites"].items())))
    return out


DOCS = Path(__file__).resolve().parents[2] / "docs" / "properties.md"
DOCS_BEGIN = "<!-- attention support table: python -m contract.evidence.release_facts docs -->"
DOCS_END = "<!-- end of the attention support table -->"


def support_table(facts: dict[str, ReleaseFacts]) -> str:
    """Per release, each backend's ``AttentionCGSupport`` for the target's layers and the draft
    model's, with the line that decides it. The same builder answers for both roles (each calls
    ``get_cudagraph_support(vllm_config, kv_cache_spec)`` with the one ``vllm_config``); a role
    differs by which backend serves it: ``--attention-backend`` the target's layers,
    ``speculative_config.attention_backend`` the draft model's."""
    out = []
    for release in sorted(facts, key=lambda r: tuple(int(x) for x in r.split("."))):
        out += ["", f"<details><summary>vLLM {release}: {len(facts[release].attention_backends)} backends</summary>", "",
                "| backend | target | drafter | decided by | line |", "|---|---|---|---|---|"]
        for b in facts[release].attention_backends:
            levels = " or ".join(f"`{level}`" for level in b.support) or "decided at run time"
            condition = b.condition.replace("|", "\\|") or "fixed"
            out.append(f"| `{b.backend}` | {levels} | {levels} | {condition} | `{b.where}` |")
        out += ["", "</details>"]
    return "\n".join([DOCS_BEGIN, *out, "", DOCS_END])


def docs_with_table(text: str, facts: dict[str, ReleaseFacts]) -> str:
    """``docs/properties.md`` with its attention support table regenerated from ``facts``."""
    if text.count(DOCS_BEGIN) != 1 or text.count(DOCS_END) != 1:
        raise ValueError(f"{DOCS} must hold the attention support table's markers once each")
    head, rest = text.split(DOCS_BEGIN)
    return head + support_table(facts) + rest.split(DOCS_END, 1)[1]


def main(argv: list[str]) -> int:
    if argv == ["docs"]:
        from contract.core.output import write_atomic

        write_atomic(DOCS, docs_with_table(DOCS.read_text(), committed()))
        return 0
    if len(argv) != 2:
        print("usage: python -m contract.evidence.release_facts VERSION PATH/TO/site-packages/vllm | docs",
              file=sys.stderr)
        return 2
    release, root = argv
    try:
        facts = read(release, Path(root))
    except (OSError, SyntaxError, ValueError) as exc:
        print(f"error: cannot read vLLM {release}'s source at {root}: {exc}", file=sys.stderr)
        return 2
    data = json.loads(TABLE.read_text()) if TABLE.exists() else {}
    kept = {k: v for k, v in data.get(release, {}).items()
            if k in ("support_by_capability", "adaptive_refused_by_capability")}
    data[release] = {**to_json(facts), **kept}
    text = json.dumps(dict(sorted(data.items())), indent=1) + "\n"
    from contract.core.output import write_atomic

    write_atomic(TABLE, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
