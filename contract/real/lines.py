"""Which way each branching statement of vLLM's code went while a trace replayed on a release.

Used in a release's environment by ``contract/evidence/traced.py``: per branching statement of
vLLM's code that ran while a trace replayed, the outcome of each execution, per step. With a tree
on top of the installed release (``overlay.py``), the tree's lines are the ones recorded.

What is traced: frames whose code lives under the ``vllm`` package (the installed one, or the
``--vllm-src`` tree) and that are either a decision point's function (every function the replay
tracks, ``decisions.WHERE``, and ``VllmConfig.__post_init__``; the ones reached form the
witness's decision path) or called, at any depth, while one of those is running. Each such frame
gets a local tracer with per-instruction events (``f_trace_opcodes``); the executed instruction
offsets are mapped back to the statements of the function's ``ast`` through the code object's
positions (``co_positions``), so a multi-line condition, an ``and``/``or`` chain or a conditional
expression is resolved operand by operand, not line by line.

A *branching statement* is an ``if``/``elif``/``while`` (outcome: whether its body ran), an
``assert`` (passed or failed), a ``raise`` (ran), or a simple statement holding an ``and``/``or``
chain or a conditional expression, or assigning a comparison to a name (the value assigned, read
from the frame, and which operands ran). Comprehensions, lambdas and ``for``/``try`` headers are
not analysed (their calls are still traced).
"""

from __future__ import annotations

import ast
import dis
import enum
import functools
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

CONFIG_STEP = -1  # the scenario's VllmConfig, built before the first event
# Instructions a statement's region runs after its test is decided (the exits 3.11 places at an
# ``if``'s position, the re-raise of a ``finally`` copy), not part of evaluating the test.
_AFTER_TEST = frozenset({"RERAISE", "LOAD_CONST", "RETURN_VALUE", "NOP", "PUSH_EXC_INFO", "POP_EXCEPT", "COPY",
                         "POP_TOP", "SWAP", "JUMP_BACKWARD", "JUMP_FORWARD"})
_NOT_BODY = frozenset({"RERAISE", "COPY", "POP_EXCEPT", "PUSH_EXC_INFO"})
_SKIPPED_CODES = ("<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>", "<lambda>", "<module>")


# -- the source side: statements and where their instructions are --------------------------------

def _inside(pos, node) -> bool:
    """An instruction's position (line, end line, col, end col) lies within ``node``'s span."""
    return ((pos[0], pos[2]) >= (node.lineno, node.col_offset)
            and (pos[1], pos[3]) <= (node.end_lineno, node.end_col_offset))


def _child_statements(node) -> list[ast.stmt]:
    out = []
    for name in ("body", "orelse", "finalbody", "handlers", "cases"):
        for child in getattr(node, name, None) or []:
            if isinstance(child, ast.ExceptHandler) or type(child).__name__ == "match_case":
                out += child.body
            else:
                out.append(child)
    return out


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp,
           ast.DictComp, ast.GeneratorExp)


def _own_nodes(node: ast.AST, kinds: tuple) -> list[ast.AST]:
    """Nodes of ``kinds`` under ``node``, not entering nested scopes or nested statements."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        for child in ast.iter_child_nodes(n):
            if isinstance(child, (_SCOPES + (ast.stmt,))):
                continue
            if isinstance(child, kinds):
                out.append(child)
            stack.append(child)
    return sorted(out, key=lambda n: (n.lineno, n.col_offset))


@dataclass
class Statement:
    """A branching statement of a function."""

    index: int
    node: ast.stmt
    kind: str  # if, elif, while, assert, raise, assign, return, expr, ...
    header: tuple[int, int]  # the statement's lines (an if/while: its header, to the end of the test)
    text: str
    boolops: list[ast.BoolOp]
    ifexps: list[ast.IfExp]
    target: str | None  # the name a simple assignment stores (its value is read after the store)

    @property
    def compound(self) -> bool:
        return isinstance(self.node, (ast.If, ast.While))


@dataclass
class FileSource:
    path: Path
    lines: list[str]
    tree: ast.Module
    defs: list[tuple[ast.AST, str]]  # (FunctionDef, qualname), every function of the file

    def def_span(self, node) -> tuple[int, int]:
        first = min([d.lineno for d in node.decorator_list] + [node.lineno])
        return first, node.end_lineno

    def function_for(self, code) -> tuple[ast.AST, str] | None:
        """The ``def`` a code object is compiled from; for a block cut from a method (compiled
        from the method's own statements), the innermost ``def`` holding its first line."""
        for node, qualname in self.defs:
            if node.name == code.co_name and self.def_span(node)[0] == code.co_firstlineno:
                return node, qualname
        holding = [(node, q) for node, q in self.defs if node.lineno <= code.co_firstlineno <= node.end_lineno]
        return max(holding, key=lambda d: d[0].lineno) if holding else None

    def source(self, first: int, last: int) -> str:
        import textwrap

        return textwrap.dedent("".join(self.lines[first - 1:last])).rstrip()


@functools.lru_cache(maxsize=None)
def file_source(filename: str) -> FileSource | None:
    try:
        text = Path(filename).read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, SyntaxError, ValueError):
        return None
    defs: list[tuple[ast.AST, str]] = []

    def walk(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qualname = prefix + child.name
                defs.append((child, qualname))
                walk(child, qualname + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    return FileSource(Path(filename), text.splitlines(keepends=True), tree, defs)


def colon_line(node: ast.stmt, last: int, lines: list[str]) -> int:
    """The line holding a compound statement's ``:`` after its header expression ends on ``last``
    (a parenthesised condition closes on the next line): the header ends there."""
    body = getattr(node, "body", None)
    limit = body[0].lineno - 1 if body else last
    for number in range(last, max(limit, last) + 1):
        if lines[number - 1].split("#")[0].rstrip().endswith(":"):
            return number
    return last


def _is_condition(value) -> bool:
    return isinstance(value, (ast.Compare, ast.BoolOp, ast.IfExp)) or (
        isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.Not))


def _statement(index: int, node: ast.stmt, source: FileSource) -> Statement | None:
    if isinstance(node, (ast.If, ast.While)):
        test = ast.Expr(node.test, lineno=0, col_offset=0)  # the test alone, not the body
        boolops, ifexps = _own_nodes(test, (ast.BoolOp,)), _own_nodes(test, (ast.IfExp,))
    else:
        boolops, ifexps = _own_nodes(node, (ast.BoolOp,)), _own_nodes(node, (ast.IfExp,))
    target = None
    if isinstance(node, ast.If):
        kind = "elif" if source.lines[node.lineno - 1][node.col_offset:].startswith("elif") else "if"
        header = (node.lineno, colon_line(node, node.test.end_lineno, source.lines))
    elif isinstance(node, ast.While):
        kind, header = "while", (node.lineno, colon_line(node, node.test.end_lineno, source.lines))
    elif isinstance(node, (ast.Assert, ast.Raise)):
        kind, header = type(node).__name__.lower(), (node.lineno, node.end_lineno)
    elif isinstance(node, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith, ast.Try, ast.FunctionDef,
                           ast.AsyncFunctionDef, ast.ClassDef)) or type(node).__name__ in ("Match", "TryStar"):
        return None
    else:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if len(targets) == 1 and getattr(node, "value", None) is not None and _is_condition(node.value):
            if isinstance(targets[0], ast.Name):
                target = targets[0].id
            elif isinstance(targets[0], ast.Attribute) and isinstance(targets[0].value, ast.Name):
                target = f"{targets[0].value.id}.{targets[0].attr}"  # read back from the object's __dict__
        returns_condition = isinstance(node, ast.Return) and node.value is not None and _is_condition(node.value)
        if not boolops and not ifexps and target is None and not returns_condition:
            return None
        kind = "assign" if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) else type(node).__name__.lower()
        header = (node.lineno, node.end_lineno)
    return Statement(index, node, kind, header, source.source(*header), boolops, ifexps, target)


@dataclass
class CodeInfo:
    """A traced code object: its function, its branching statements, and per instruction (index
    = byte offset // 2) the statement whose region holds it and the operands it evaluates."""

    relpath: str
    function: str
    def_lines: tuple[int, int]
    root: bool
    statements: list[Statement] = field(default_factory=list)
    region: dict[int, int] = field(default_factory=dict)  # instruction -> statement index
    marks: dict[int, tuple] = field(default_factory=dict)  # instruction -> ((node id, part), ...)
    assertion: set[int] = field(default_factory=set)  # LOAD_ASSERTION_ERROR instructions
    opnames: dict[int, str] = field(default_factory=dict)  # instruction -> opname, in a region
    all_opnames: dict[int, str] = field(default_factory=dict)  # instruction -> opname
    stores: dict[int, str] = field(default_factory=dict)  # byte offset of a STORE -> the name
    positions: list = field(default_factory=list)
    nodes: dict[int, ast.AST] = field(default_factory=dict)  # id -> BoolOp / IfExp
    source: FileSource | None = None


def _innermost(body: list[ast.stmt], pos) -> ast.stmt | None:
    found = None
    level = body
    while level:
        nxt = None
        for stmt in level:
            if _inside(pos, stmt):
                found, nxt = stmt, stmt
                break
        if nxt is None or isinstance(nxt, _SCOPES):
            break
        level = _child_statements(nxt)
    return found


def analyse(code, relpath: str, root: bool, filename: str) -> CodeInfo | None:
    source = file_source(filename)
    if source is None:
        return None
    found = source.function_for(code)
    if found is None:
        return None
    fn, qualname = found
    info = CodeInfo(relpath, qualname, source.def_span(fn), root, source=source)
    if code.co_name in _SKIPPED_CODES:
        return info
    statements: dict[int, Statement] = {}  # id(node) -> Statement
    info.positions = list(code.co_positions())
    instructions = list(dis.get_instructions(code))
    # A block cut from a method ends in ``return locals()`` placed at its first statement
    # (``mrv2/blocks.py``): not that statement's execution.
    synthetic = set()
    tail = [i.opname for i in instructions[-4:]]
    if tail[-1:] == ["RETURN_VALUE"] and any(i.argval == "locals" for i in instructions[-4:]):
        synthetic = {i.offset for i in instructions[-4:]}
    # An EXTENDED_ARG is traced as the instruction it extends (a far conditional jump).
    extended = {}
    for before, after in zip(reversed(instructions[:-1]), reversed(instructions[1:])):
        if before.opname == "EXTENDED_ARG":
            extended[before.offset] = extended.get(after.offset, after.opname)
    for instr in instructions:
        opname = extended.get(instr.offset, instr.opname)
        info.all_opnames[instr.offset // 2] = opname
        if instr.opname == "RESUME" or instr.offset in synthetic:
            continue
        pos = instr.positions
        if pos is None or pos.lineno is None or pos.col_offset is None:
            continue
        p = (pos.lineno, pos.end_lineno, pos.col_offset, pos.end_col_offset)
        stmt = _innermost(fn.body, p)
        if stmt is None:
            continue
        if id(stmt) not in statements:
            made = _statement(len(statements), stmt, source)
            statements[id(stmt)] = made
            if made is not None:
                info.statements.append(made)
                made.index = len(info.statements) - 1
                for node in made.boolops + made.ifexps:
                    info.nodes[id(node)] = node
        made = statements[id(stmt)]
        if made is None:
            continue
        if made.compound and any(_inside(p, s) for s in _child_statements(stmt)):
            continue
        index = instr.offset // 2
        info.region[index] = made.index
        info.opnames[index] = opname
        marks = []
        for b in made.boolops:
            for k, v in enumerate(b.values):
                if _inside(p, v):
                    marks.append((id(b), k))
        for e in made.ifexps:
            for part in ("test", "body", "orelse"):
                if _inside(p, getattr(e, part)):
                    marks.append((id(e), part))
        if marks:
            info.marks[index] = tuple(marks)
        if instr.opname == "LOAD_ASSERTION_ERROR":
            info.assertion.add(index)
        if made.target and (instr.opname in ("STORE_FAST", "STORE_NAME", "STORE_DEREF", "STORE_GLOBAL")
                            and instr.argval == made.target
                            or instr.opname == "STORE_ATTR" and made.target.endswith("." + str(instr.argval))):
            info.stores[instr.offset] = made.target
    return info


# -- outcomes --------------------------------------------------------------------------------------

def short(value) -> str:
    """A value as a reviewer reads it: enums by name, short scalars as written, else the type."""
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:37] + "...")
    return type(value).__name__


def _truthy(text: str) -> str | None:
    if text in ("True",):
        return "T"
    if text in ("False", "None", "0", "''"):
        return "F"
    return None


def outcome(stmt: Statement, info: CodeInfo, run_marks: set, next_index: int | None, raised: bool,
            value: str | None, failed: bool, jumped: bool = False) -> tuple[str, str]:
    """(primary, detail) of one execution of ``stmt``: primary is the branch taken (or the value
    assigned); detail is which operands of its ``and``/``or`` chains and conditional expressions ran."""
    node = stmt.node
    primary = ""
    known: dict[int, str] = {}  # id(BoolOp) -> T/F when its truthiness is known
    if stmt.compound:
        if raised and next_index is None and not jumped:
            primary = "raised"  # the test itself raised
        else:
            pos = info.positions[next_index] if next_index is not None else None
            # An exception's re-raise after the test is placed at the body's last line by 3.11:
            # reaching it is not running the body.
            took = (pos is not None and pos[0] is not None and info.all_opnames.get(next_index) not in _NOT_BODY
                    and any(_inside(pos, s) for s in node.body))
            primary = "true" if took else "false"
            if isinstance(node.test, ast.BoolOp):
                known[id(node.test)] = "T" if took else "F"
    elif isinstance(node, ast.Assert):
        primary = "failed" if failed else ("raised" if raised and next_index is None else "passed")
        if isinstance(node.test, ast.BoolOp) and primary != "raised":
            known[id(node.test)] = "F" if failed else "T"
    elif isinstance(node, ast.Raise):
        primary = "raised"
    elif stmt.target is not None and value is not None and value != "?":
        primary = f"{stmt.target} = {value}"
        if isinstance(node.value, ast.BoolOp) and _truthy(value):
            known[id(node.value)] = _truthy(value)
    elif isinstance(node, ast.Return) and value is not None and node.value is not None:
        primary = f"return {value}"
        if isinstance(node.value, ast.BoolOp) and _truthy(value):
            known[id(node.value)] = _truthy(value)
    leaves: list[tuple[tuple[int, int], str]] = []  # ((line, col), "operand: mark")
    nested = {id(v) for b in stmt.boolops for v in b.values if isinstance(v, ast.BoolOp)}

    def visit(b: ast.BoolOp, evaluated_at_all: bool) -> None:
        evaluated = {k for (n, k) in run_marks if n == id(b)} if evaluated_at_all else set()
        stop, go = ("F", "T") if isinstance(b.op, ast.And) else ("T", "F")
        last = max(evaluated) if evaluated else -1
        for k, v in enumerate(b.values):
            if k < last:
                mark = go
            elif k == last:
                mark = stop if last < len(b.values) - 1 else known.get(id(b), "?")
            else:
                mark = "-"
            if isinstance(v, ast.BoolOp):
                if mark in ("T", "F"):
                    known[id(v)] = mark
                visit(v, mark != "-")
            else:
                leaves.append(((v.lineno, v.col_offset), f"{_clip(_segment(info, v))}: {mark}"))

    for b in stmt.boolops:
        if id(b) not in nested:
            visit(b, True)
    for e in stmt.ifexps:
        ran = {part for (n, part) in run_marks if n == id(e)}
        if "body" in ran or "orelse" in ran:
            leaves.append(((e.test.lineno, e.test.col_offset),
                           f"{_clip(_segment(info, e.test))}: {'T' if 'body' in ran else 'F'}"))
    parts = [text for _, text in sorted(leaves)]
    detail = " · ".join(parts)
    return primary or detail or "ran", detail


def _segment(info: CodeInfo, node: ast.AST) -> str:
    """The node's source as written (``ast.unparse`` would requote strings)."""
    if info.source is not None:
        lines = info.source.lines[node.lineno - 1:node.end_lineno]
        if lines:
            if len(lines) == 1:
                return lines[0][node.col_offset:node.end_col_offset]
            return lines[0][node.col_offset:] + "".join(lines[1:-1]) + lines[-1][:node.end_col_offset]
    return ast.unparse(node)


def _clip(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


@dataclass
class Executions:
    """Per (code, statement, step), how many executions had each (primary, detail) outcome."""

    counts: dict[tuple, Counter] = field(default_factory=dict)

    def add(self, info: CodeInfo, stmt: Statement, step: int, result: tuple[str, str]) -> None:
        key = (info.relpath, info.function, info.def_lines, stmt.header, stmt.kind, stmt.text)
        self.counts.setdefault(key, Counter())[(step, *result)] += 1

    def to_json(self) -> list[dict]:
        out = []
        for (relpath, function, def_lines, header, kind, text), counter in sorted(self.counts.items()):
            steps: dict[str, list] = {}
            for (step, primary, detail), n in sorted(counter.items()):
                steps.setdefault(str(step), []).append([primary, detail, n])
            out.append({"path": relpath, "function": function, "def": list(def_lines), "lines": list(header),
                        "kind": kind, "text": text, "steps": steps})
        return out


def digest(info: CodeInfo, seq: list, step: int, raised: bool, executions: Executions) -> None:
    """Turn one frame segment's executed instructions into statement executions."""
    cur: int | None = None
    marks: set = set()
    value: str | None = None
    failed = False

    last = -1

    def close(next_index):
        # A frame left by an exception right after the test's conditional jump: the test was
        # decided (false, the jump skipped the body), the exception came later.
        jumped = last >= 0 and info.opnames.get(last, "").startswith(("POP_JUMP", "JUMP_IF"))
        executions.add(info, info.statements[cur], step,
                       outcome(info.statements[cur], info, marks, next_index, raised, value, failed, jumped))

    for item in seq:
        if type(item) is tuple:  # a value read after a store, or the value returned
            if cur is not None and (item[0] == "v" or isinstance(info.statements[cur].node, ast.Return)):
                value = item[1]
            continue
        index = item // 2
        pos = info.positions[index] if index < len(info.positions) else None
        if pos is None or pos[0] is None:
            continue
        r = info.region.get(index)
        if cur is not None and r != cur:
            close(index)
            cur = None
        if r is not None:
            if cur is None:
                cur, marks, value, failed, last = r, set(), None, False, -1
            if info.opnames.get(index) not in _AFTER_TEST:
                last = index
            got = info.marks.get(index)
            if got:
                marks.update(got)
            if index in info.assertion:
                failed = True
    if cur is not None:
        close(None)


# -- the tracer ------------------------------------------------------------------------------------

class Tracer:
    """``sys.settrace`` restricted to vLLM frames on the decision path and what they call."""

    def __init__(self, packages: list[Path], roots: set[tuple[str, int]], root_codes: set | None = None):
        self.packages = [str(p.resolve()) + os.sep for p in packages]
        self.roots = roots  # (file under the package, first line of the def or block)
        self.root_codes = root_codes if root_codes is not None else set()  # or the code objects themselves
        self.path_functions: dict[int, set] = {}  # step -> the roots entered: (file, def first, def last)
        self.codes: dict = {}
        self.files: dict[str, str | None] = {}
        self.live = 0
        self.step = CONFIG_STEP
        self.executions = Executions()
        self.raised: dict[int, list] = {}  # the current step's exception events
        self.frames = 0
        self.instructions = 0
        self.reached: dict[int, set] = {}
        self.forked_crashes: list[list[dict]] = []  # crash chains of processes forked while tracing

    def relpath(self, filename: str) -> str | None:
        if filename not in self.files:
            resolved = str(Path(filename).resolve()) if not filename.startswith("<") else filename
            rel = None
            for package in self.packages:
                if resolved.startswith(package):
                    rel = resolved[len(package):].replace(os.sep, "/")
                    break
            self.files[filename] = rel
        return self.files[filename]

    def info(self, code):
        got = self.codes.get(code, False)
        if got is False:
            rel = self.relpath(code.co_filename)
            got = None
            if rel is not None:
                root = (rel, code.co_firstlineno) in self.roots or code in self.root_codes
                got = analyse(code, rel, root, code.co_filename) or None
                if got is None and root:
                    got = CodeInfo(rel, code.co_qualname, (code.co_firstlineno, code.co_firstlineno), True)
            self.codes[code] = got
        return got

    def global_trace(self, frame, event, arg):
        info = self.info(frame.f_code)
        if info is None or not (info.root or self.live):
            return None
        if info.root:
            self.live += 1
            self.path_functions.setdefault(self.step, set()).add((info.relpath, *info.def_lines))
        self.frames += 1
        self.reached.setdefault(self.step, set()).add((info.relpath, info.function))
        if not info.statements and not info.root:
            frame.f_trace_opcodes = False
            frame.f_trace_lines = False
            return self._exceptions_only(info)
        frame.f_trace_lines = False
        frame.f_trace_opcodes = True
        return self._local(info)

    def _exceptions_only(self, info):
        def local(frame, event, arg):
            if event == "exception":
                self._exception(info, frame, arg)
            return local
        return local

    def _local(self, info):
        seq: list = []
        append = seq.append
        stores = info.stores
        step = self.step
        state = {"last": -1, "event": ""}

        def local(frame, event, arg):
            if event == "opcode":
                last = state["last"]
                if last in stores:
                    append(("v", _stored(frame, stores[last])))
                lasti = frame.f_lasti
                state["last"] = lasti
                append(lasti)
            elif event == "exception":
                self._exception(info, frame, arg)
            elif event == "return":
                # Leaving by an exception: the exception event (or a RERAISE) came last.
                raised = arg is None and (state["event"] == "exception" or _opname(frame.f_code, state["last"]) == "RERAISE")
                if not raised:
                    append(("r", short(arg)))  # what a return statement returned
                self.instructions += len(seq)
                if info.statements:
                    digest(info, seq, step, raised, self.executions)
                seq.clear()
                if info.root:
                    self.live -= 1
            state["event"] = event
            return local

        return local

    def _exception(self, info, frame, arg) -> None:
        exc = arg[1]
        if self.step not in self.raised:
            self.raised = {self.step: []}  # only the current step's are kept: the halting one is the last step's
        self.raised[self.step].append((exc, info, frame.f_code, frame.f_lasti))

    def crash(self, steps: list[dict]) -> list[dict]:
        """The chain of the exception that stopped vLLM: the raising statement first, then each
        caller's statement, innermost first, as far as vLLM's frames go (where this process ran
        no vLLM code, a forked rank's or stage's, ``merge``)."""
        from contract.real import errors

        if not steps or "halted" not in steps[-1]:
            return []
        if not self.raised and self.forked_crashes:
            return next((c for c in self.forked_crashes if c), [])
        halted = steps[-1]["halted"]
        chains: dict[int, list] = {}
        for exc, info, code, lasti in self.raised.get(len(steps) - 1, []):
            chains.setdefault(id(exc), []).append((exc, info, code, lasti))
        for chain in reversed(list(chains.values())):
            exc = chain[0][0]
            texts = {errors.normalise(exc), errors.resolve_rejected(exc), _first_line(exc)}
            if not any(halted == t or halted.startswith(t) for t in texts):
                continue
            out, seen = [], set()
            for exc, info, code, lasti in chain:
                stmt = _statement_of(info, code, lasti)
                if stmt is None:
                    continue
                key = (info.relpath, info.function, stmt["lines"][0])
                if key in seen:
                    continue
                seen.add(key)
                out.append({"type": type(exc).__name__, "message": _first_line(exc), "path": info.relpath,
                            "function": info.function, "def": list(info.def_lines), **stmt})
            return out
        return []

    def install(self) -> None:
        global ACTIVE
        ACTIVE = self
        sys.settrace(self.global_trace)

    def uninstall(self) -> None:
        global ACTIVE
        ACTIVE = None
        sys.settrace(None)

    def snapshot(self, steps: list[dict]) -> dict:
        """What a forked process traced (the trace function survives ``fork``), for its parent's
        ``merge``: a DP rank's or PP stage's replay runs vLLM's code in that process alone."""
        return {"counts": self.executions.counts, "reached": self.reached, "path_functions": self.path_functions,
                "frames": self.frames, "instructions": self.instructions, "crash": self.crash(steps)}

    def merge(self, snapshot: dict) -> None:
        for key, counter in snapshot["counts"].items():
            self.executions.counts.setdefault(key, Counter()).update(counter)
        for mine, theirs in ((self.reached, snapshot["reached"]), (self.path_functions, snapshot["path_functions"])):
            for step, items in theirs.items():
                mine.setdefault(step, set()).update(items)
        self.frames += snapshot["frames"]
        self.instructions += snapshot["instructions"]
        self.forked_crashes.append(snapshot["crash"])


ACTIVE: Tracer | None = None  # the tracer installed in this process, which a forked rank reports to


def _stored(frame, target: str) -> str:
    """The value a statement just stored: a local, or an attribute read from the object's
    ``__dict__`` (never through a property: no code of the traced program runs here)."""
    if "." not in target:
        return short(frame.f_locals.get(target))
    holder, attr = target.split(".", 1)
    obj = frame.f_locals.get(holder)
    found = getattr(obj, "__dict__", {}).get(attr, _MISSING) if obj is not None else _MISSING
    return "?" if found is _MISSING else short(found)


_MISSING = object()


def _opname(code, lasti: int) -> str:
    if lasti < 0:
        return ""
    return dis.opname[code.co_code[lasti]]


def _header_end(stmt: ast.stmt, lines: list[str]) -> int:
    if isinstance(stmt, (ast.If, ast.While)):
        return colon_line(stmt, stmt.test.end_lineno, lines)
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return colon_line(stmt, stmt.iter.end_lineno, lines)
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return colon_line(stmt, stmt.items[-1].context_expr.end_lineno, lines)
    if isinstance(stmt, (ast.Try, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return stmt.lineno
    return stmt.end_lineno


def _statement_of(info: CodeInfo, code, lasti: int) -> dict | None:
    """The statement (its header for a compound one) holding the instruction at ``lasti``."""
    source = info.source or file_source(code.co_filename)
    found = source.function_for(code) if source is not None else None
    positions = info.positions or list(code.co_positions())
    pos = positions[lasti // 2] if 0 <= lasti // 2 < len(positions) else None
    if found is None or pos is None or pos[0] is None:
        return None
    stmt = _innermost(found[0].body, pos)
    if stmt is None:
        return None
    lines = [stmt.lineno, _header_end(stmt, source.lines)]
    return {"lines": lines, "text": source.source(*lines), "kind": type(stmt).__name__.lower()}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text and text[0] else type(exc).__name__


def recording_roots(decisions) -> set:
    """Every function the replay's session tracks as a decision point (``decisions.tracked``),
    as code objects: the roots of the tracing, whichever tree their module was loaded from."""
    import inspect

    codes: set = set()
    original = decisions.tracked

    def tracked(function, point, location=None):
        raw = function.__func__ if isinstance(function, (staticmethod, classmethod)) else function
        code = getattr(inspect.unwrap(raw), "__code__", None)
        if code is not None:
            codes.add(code)
        return original(function, point, location)

    decisions.tracked = tracked
    return codes


def config_root() -> set:
    import inspect

    from vllm.config import VllmConfig

    return {inspect.unwrap(VllmConfig.__post_init__).__code__}
