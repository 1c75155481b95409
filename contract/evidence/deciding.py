"""The deciding lines of a violation: the branching statements of vLLM's code whose outcome differs
between the witness and its nearest non-violating neighbour, replayed on the same release.

Pure: the two replays' per-statement outcomes are read from ``contract/real/lines.py``'s
JSON (one child process per replay, ``contract/evidence/deciding_run.py`` starts them); the
neighbour is chosen from the model's exploration (``contract/core/explore.py``).

**The neighbour** (``nearest_neighbour``) is a scenario of the policy's canonical list
(``Exploration.scenario_list``) that never shows the class's signature (``Exploration.occurrences``),
that vLLM builds (the model does not refuse its config), and that takes the witness's events at
least through the violating step; among those, the fewest ``Scenario`` fields differing from the
witness's, then the most default-like (fewest deviations from ``Scenario()``,
``classes.deviations``), then the one whose model steps look most like the witness's up to the
violating step (``shape``: same stacks, dispatches of the same role and mode through the same
layers), then the explorer's order. It replays the witness's events as far as its runner takes
them (``takes``). A person may name it instead (``given_neighbour``).

**Deciding statements** (``deciding``): every branching statement reached in both replays at the
same step, up to and including the violating step, whose set of outcomes at that step differs (an
``if`` whose body ran in one and not the other, an assignment of a different value, an assertion
that failed in one); a statement reached in only one run is a consequence of an earlier difference
and is not listed (``reached_only`` lists the functions one side alone entered). For a crash, the
statement that raised and its callers' statements (innermost first, as far as vLLM's traced frames
go) come first.

**Ranking** (``rank``): the crash chain; the violating step's statements, those in the functions
on its decision path (the decision points the replay reached at that step) first; then, of earlier
steps, those in a function on the violating step's decision path; then those assigning a name that
a statement ranked so far reads (``use_cudagraphs`` in ``_dummy_run`` feeds the proposer's
``not use_cudagraphs``); then the rest. Within a group: latest step first, decision-path functions
before their callees, source order.

**The setting rule**: a statement whose condition reads nothing but the setting that differs (a
name ``SETTING_NAMES`` lists for a differing field, with only neutral names beside it: ``self``,
config holders, enum classes and members, constants, the mode predicates), or that lies in a method
of the setting's value class (``CUDAGraphMode.mixed_mode`` when ``cudagraph_mode`` differs), says
what the setting is, not why the violation happens: such statements are dropped whenever another
difference exists, and marked ``explained_by_setting`` where they are all there is. At most
``LIMIT`` statements are kept.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import re
from dataclasses import dataclass

from contract.core.classes import Signature, deviations, signatures
from contract.core.engine import Run
from contract.core.events import Event
from contract.core.properties import check
from contract.core.scenario import Scenario

LIMIT = 15
CONFIG_STEP = -1
PERMALINK = "https://github.com/vllm-project/vllm/blob/v{release}/vllm/{path}#L{first}-L{last}"

# vLLM's names for each scenario setting (what a condition reads when it reads the setting itself).
SETTING_NAMES: dict[str, frozenset[str]] = {
    "breakable": frozenset({"VLLM_USE_BREAKABLE_CUDAGRAPH", "is_breakable_cudagraph_enabled", "use_breakable_cg",
                            "use_breakable_cudagraph", "breakable"}),
    "ubatching": frozenset({"use_ubatching", "enable_dbo", "ubatch_size", "num_ubatches"}),
    "cudagraph_mode": frozenset({"cudagraph_mode"}),
    "compilation_mode": frozenset({"mode", "CompilationMode", "level"}),
    "splitting_ops": frozenset({"splitting_ops", "splitting_ops_contain_attention", "_attention_ops"}),
    "drafter": frozenset({"speculative_config", "drafter", "use_eagle", "uses_draft_model", "method",
                          "use_spec_decode", "speculator"}),
    "attention_support": frozenset({"cudagraph_support", "min_cg_support", "get_cudagraph_support",
                                    "AttentionCGSupport"}),
    "spec_enforce_eager": frozenset({"enforce_eager"}),
    "uniform_decode_query_len": frozenset({"uniform_decode_query_len", "num_speculative_tokens",
                                           "decode_query_len"}),
    "speculator": frozenset({"method", "use_multi_module_mtp", "use_dflash", "uses_draft_model"}),
    "model_compiled": frozenset({"has_compiled_submodule"}),
    "draft_compiled": frozenset({"has_compiled_submodule"}),
    "adaptive_verification": frozenset({"enable_adaptive_verification", "adaptive_verification"}),
    "extensible_kv_cache": frozenset({"enable_extensible_kv_cache"}),
    "varlen_decode_bound": frozenset({"get_varlen_cudagraph_max_query_len", "get_varlen_cudagraph_unsupported_backend"}),
    "attention_support_draft_only": frozenset({"target_layer_names", "target_attn_layer_names", "checked_layer_names",
                                               "draft_attn_layer_names"}),
}
# The classes of a setting's values: their methods are predicates of a mode, so a difference
# inside one is the differing mode itself.
SETTING_CLASSES: dict[str, tuple[str, ...]] = {
    "cudagraph_mode": ("CUDAGraphMode",), "compilation_mode": ("CompilationMode",),
    "attention_support": ("AttentionCGSupport",),
}
# Names that carry no setting of their own: holders of settings, and pure predicates of a mode.
NEUTRAL = frozenset({
    "self", "cls", "vllm_config", "compilation_config", "cache_config", "parallel_config", "scheduler_config",
    "model_config", "config", "envs", "isinstance", "len", "getattr", "hasattr", "bool", "not",
    "has_full_cudagraphs", "has_piecewise_cudagraphs", "mixed_mode", "decode_mode", "separate_routine",
    "requires_piecewise_compilation", "without_piecewise", "has_mode", "max_cudagraph_mode",
    "valid_runtime_modes", "is_valid_runtime_mode",
})


# -- the violation and its neighbour ---------------------------------------------------------------

def violation(scenario: Scenario, events: list[Event], policy) -> tuple[Signature, int] | None:
    """The first class signature the model shows on these events (a halt included) and its step."""
    run = Run(scenario, policy)
    for event in events:
        if not run.can(event):
            break
        record = run.apply(event)
        shown = signatures(record, check(record, scenario, policy.runner))
        if shown:
            return shown[0][0], record.index
    return None


def takes(scenario: Scenario, events: list[Event], policy) -> tuple[Event, ...]:
    """The longest prefix of ``events`` the runner takes under ``scenario`` (it stops where the
    model halts or an event cannot happen)."""
    return tuple(r.event for r in _records(scenario, events, policy))


def _records(scenario: Scenario, events: list[Event], policy) -> list:
    run = Run(scenario, policy)
    for event in events:
        if not run.can(event):
            break
        run.apply(event)
    return run.records


def shape(record) -> tuple:
    """What a step's model observation looks like apart from what the layers did: the wrapper
    stacks and, per dispatch, its role, runtime mode and the layers on its path."""
    return (tuple(sorted(record.stacks.items())),
            tuple((d.role, d.runtime_mode.name, tuple(a.layer for a in d.layers)) for d in record.dispatches))


def differing(a: Scenario, b: Scenario) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(Scenario) if getattr(a, f.name) != getattr(b, f.name))


@dataclass(frozen=True)
class Neighbour:
    scenario: Scenario
    events: tuple[Event, ...]  # the witness's events, as far as the neighbour's runner takes them
    differing: tuple[str, ...]  # the Scenario fields that differ from the witness's
    chosen: str  # "nearest" (from the model) or "given"

    @property
    def distance(self) -> int:
        return len(self.differing)

    def describe(self, witness: Scenario) -> str:
        parts = []
        for name in self.differing:
            w, n = getattr(witness, name), getattr(self.scenario, name)
            parts.append(f"{name} {_value(w)} → {_value(n)}")
        return ", ".join(parts) or "the same scenario"


def _value(v) -> str:
    return v.name if isinstance(v, enum.Enum) else str(v)


def nearest_neighbour(witness: Scenario, events: list[Event], signature: Signature, step: int,
                      occurrences: dict, scenarios: list[Scenario], policy) -> Neighbour | None:
    """The nearest scenario the explorer knows that never shows ``signature`` (module docstring).
    Past distance and default-likeness, ties go to the neighbour whose model observations look most
    like the witness's up to the violating step (``shape``: the same stacks, and dispatches of the
    same role and mode through the same layers), so the two replays differ in what the layers
    did rather than in which layers exist."""
    showing = {o.scenario for o in occurrences.get(signature, [])}
    mine = [shape(r) for r in _records(witness, events, policy)[: step + 1]]
    best = None
    for index, candidate in enumerate(scenarios):
        if candidate in showing or candidate == witness:
            continue
        if policy.engine.initial_state(candidate, policy).halted:
            continue  # vLLM refuses its config: nothing to compare
        records = _records(candidate, events, policy)
        if len(records) <= step:
            continue
        diff = differing(witness, candidate)
        alike = sum(a == shape(r) for a, r in zip(mine, records))
        key = (len(diff), len(deviations(candidate)), -alike, index)
        if best is None or key < best[0]:
            best = (key, Neighbour(candidate, tuple(r.event for r in records), diff, "nearest"))
    return best[1] if best else None


def given_neighbour(witness: Scenario, neighbour: Scenario, events: list[Event], policy) -> Neighbour:
    return Neighbour(neighbour, takes(neighbour, events, policy), differing(witness, neighbour), "given")


# -- the deciding statements ------------------------------------------------------------------------

@dataclass
class Deciding:
    path: str  # relative to vllm/
    function: str  # the enclosing def's qualname
    def_lines: tuple[int, int]  # first decorator to end
    lines: tuple[int, int]  # the statement (an if/while: its header)
    text: str
    kind: str
    step: int  # -1: the config, built before the first event
    witness: list  # [[primary, detail, count], ...] at that step
    neighbour: list
    role: str = "branch"  # "raise", "raised through", or "branch"
    on_path: bool = False  # its function is a decision point reached at that step
    explained_by_setting: bool = False
    since: dict | None = None

    @property
    def label(self) -> str:
        return describe(self.kind, self.text)

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["def_lines"], out["lines"] = list(self.def_lines), list(self.lines)
        out["label"] = self.label
        return out


def describe(kind: str, text: str) -> str:
    """A statement range's label: what the lines are, in words."""
    if kind == "assign":
        name = text.split("=", 1)[0].split(":")[0].strip()
        return f"the `{name}` condition"
    if kind in ("if", "elif", "while"):
        return f"the `{kind}` test"
    if kind == "assert":
        return "the assertion"
    if kind == "raise":
        return "the raise"
    if kind == "return":
        return "the returned condition"
    return "the call" if kind == "expr" else f"the `{kind}` statement"


def _outcomes(entry: list) -> set[str]:
    return {primary for primary, _, _ in entry}


def _path_functions(result: dict, step: int) -> set[tuple[str, int, int]]:
    """(file, first line, last line) of the vLLM decision points the replay reached at ``step``
    (a function's ``def``, or a block cut from a method)."""
    if "path_functions" in result:  # the decision points' functions the tracer entered at that step
        return {tuple(x) for x in result["path_functions"].get(str(step), [])}
    where = result.get("where") or {}
    path = result.get("decision_path") or []
    index = step + 1  # decision_path opens with the config entry
    if not 0 <= index < len(path):
        return set()
    return {(where[p]["path"], *where[p]["lines"]) for p in path[index].get("points", [])
            if p in where and where[p].get("owner") == "vLLM"}


def condition(kind: str, text: str) -> ast.AST | None:
    """The condition a statement decides on (an if/while/assert test, an assigned value)."""
    source = text.strip()
    if kind in ("if", "elif", "while"):
        source = re.sub(r"^(el)?if\b|^while\b", "", source).rstrip().rstrip(":")
        source = f"({source.strip()})"
    elif kind == "assert":
        source = source[len("assert"):]
    elif kind == "assign":
        source = source.split("=", 1)[1] if "=" in source else source
    elif kind == "return":
        source = source[len("return"):]
    try:
        tree = ast.parse(source.strip(), mode="eval").body
    except SyntaxError:
        try:
            tree = ast.parse(text.strip()).body[0]
        except (SyntaxError, IndexError):
            return None
    if kind == "assert" and isinstance(tree, ast.Tuple):
        tree = tree.elts[0]  # the message is not the condition
    return tree


def names(node: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
    return out


def explained_by_setting(kind: str, text: str, fields: tuple[str, ...], function: str = "") -> bool:
    """The statement's condition reads a differing setting and nothing else that varies, or the
    statement is in a method of the setting's value class (``CUDAGraphMode.mixed_mode``)."""
    owner = function.split(".")[0] if "." in function else ""
    if owner and any(owner in SETTING_CLASSES.get(f, ()) for f in fields):
        return True
    node = condition(kind, text)
    if node is None:
        return False
    setting = set().union(*(SETTING_NAMES.get(f, frozenset()) for f in fields)) if fields else set()
    read = names(node)
    if not read & setting:
        return False
    rest = read - setting - NEUTRAL
    return all(n in ("True", "False", "None") or n.isupper() or (n[:1].isupper() and "_" not in n) for n in rest)


def differences(witness: dict, neighbour: dict, step: int, fields: tuple[str, ...]) -> list[Deciding]:
    """Every branching statement both replays reached at the same step, up to ``step``, with
    different outcomes there (unranked; the setting rule marked, nothing dropped)."""
    theirs = {(s["path"], s["function"], tuple(s["lines"])): s for s in neighbour.get("statements", [])}
    found = []
    for s in witness.get("statements", []):
        other = theirs.get((s["path"], s["function"], tuple(s["lines"])))
        if other is None:
            continue
        for key, mine in s["steps"].items():
            at = int(key)
            if at > step or key not in other["steps"] or _outcomes(mine) == _outcomes(other["steps"][key]):
                continue
            on_path = any(p == s["path"] and (first == s["def"][0] or first <= s["lines"][0] <= last)
                          for p, first, last in _path_functions(witness, at))
            found.append(Deciding(s["path"], s["function"], tuple(s["def"]), tuple(s["lines"]), s["text"],
                                  s["kind"], at, mine, other["steps"][key], on_path=on_path,
                                  explained_by_setting=explained_by_setting(s["kind"], s["text"], fields, s["function"])))
    return found


def crash_chain(witness: dict, step: int) -> list[Deciding]:
    """The statement that raised and its callers' statements, innermost first."""
    return [Deciding(e["path"], e["function"], tuple(e["def"]), tuple(e["lines"]), e["text"], e["kind"], step,
                     [["raised" if i == 0 else "raised through", e["message"], 1]], [],
                     role="raise" if i == 0 else "raised through")
            for i, e in enumerate(witness.get("crash") or [])]


def deciding(witness: dict, neighbour: dict, step: int, fields: tuple[str, ...],
             limit: int | None = LIMIT) -> list[Deciding]:
    """The ranked deciding statements (module docstring) of two ``trace_lines`` results; ``limit``
    None keeps them all."""
    out = crash_chain(witness, step)
    crash_keys = {(d.path, d.lines[0]) for d in out}
    found = [d for d in differences(witness, neighbour, step, fields) if (d.path, d.lines[0]) not in crash_keys]
    if any(not d.explained_by_setting for d in found):
        found = [d for d in found if not d.explained_by_setting]
    return (out + rank(found, step, _path_functions(witness, step)))[:limit]


def setting_reads(witness: dict, neighbour: dict, step: int, fields: tuple[str, ...]) -> list[Deciding]:
    """The differences the setting rule dropped (they read the differing setting itself), latest
    step first: shown apart, never ranked among the deciding statements."""
    found = differences(witness, neighbour, step, fields)
    if all(d.explained_by_setting for d in found):
        return []
    return sorted((d for d in found if d.explained_by_setting), key=lambda d: (-d.step, d.path, d.lines))


def assigned(d: Deciding) -> set[str]:
    """The names a statement assigns (an assignment's targets)."""
    if d.kind != "assign":
        return set()
    try:
        node = ast.parse(d.text.strip()).body[0]
    except (SyntaxError, IndexError):
        return set()
    targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
    return {n.id for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.Name)}


def rank(found: list[Deciding], step: int, path: set[tuple[str, int, int]]) -> list[Deciding]:
    """The violating step's statements (decision-path functions first); then, of earlier steps,
    those in a function on the violating step's path, then those assigning a name that one of the
    statements ranked so far reads (the value it decides on, where the name is kept across the
    call, as ``use_cudagraphs`` is), then the rest; latest step first, decision-path functions
    before their callees, source order."""
    def in_path(d: Deciding) -> bool:
        return any(p == d.path and (first == d.def_lines[0] or first <= d.lines[0] <= last) for p, first, last in path)

    def order(d: Deciding) -> tuple:
        return (-d.step, not d.on_path, d.path, d.lines)

    now = sorted((d for d in found if d.step == step), key=order)
    earlier = [d for d in found if d.step != step]
    first = sorted((d for d in earlier if in_path(d)), key=order)
    read = set().union(*(names(condition(d.kind, d.text) or ast.Constant(None)) for d in now + first))
    feeding = sorted((d for d in earlier if d not in first and assigned(d) & read), key=order)
    rest = sorted((d for d in earlier if d not in first and d not in feeding), key=order)
    return now + first + feeding + rest


def reached_only(witness: dict, neighbour: dict, step: int) -> dict[str, dict[str, list[str]]]:
    """Per step up to ``step``, the vLLM functions (traced ones: decision points and their callees)
    only one replay entered: what a branch that differs leads to, or a check one side never makes."""
    out = {}
    for at in range(CONFIG_STEP, step + 1):
        mine = {tuple(x) for x in witness.get("reached", {}).get(str(at), [])}
        theirs = {tuple(x) for x in neighbour.get("reached", {}).get(str(at), [])}
        if mine != theirs:
            out[str(at)] = {"witness": sorted(f"{f} ({p})" for p, f in mine - theirs),
                            "neighbour": sorted(f"{f} ({p})" for p, f in theirs - mine)}
    return out


# -- markdown ---------------------------------------------------------------------------------------

def permalink(release: str, path: str, lines) -> str:
    return PERMALINK.format(release=release, path=path, first=lines[0], last=lines[1])


def _shown(entry: list) -> str:
    if not entry:
        return "not reached"
    parts = []
    for primary, detail, n in entry:
        text = f"`{primary}`" if primary != detail or not detail else f"`{detail}`"
        if detail and primary != detail:
            text += f" ({detail})"
        parts.append(text + (f" ×{n}" if n > 1 else ""))
    return "; ".join(parts)


def markdown(release: str, items: list[Deciding], steps: list[str], tree_paths: frozenset[str] = frozenset()) -> list[str]:
    """The deciding statements as a page section: per statement its function (linked at its
    ``def``), its lines (linked as a statement range), the source, and the outcome in each run.
    A file in ``tree_paths`` (taken from a ``--vllm-src`` tree) is cited without a link: its lines
    are the tree's, not the release tag's."""
    lines = []
    for d in items:
        where = "start-up (VllmConfig)" if d.step == CONFIG_STEP else f"step {d.step} `{steps[d.step]}`" \
            if d.step < len(steps) else f"step {d.step}"
        short = d.function.rsplit(".", 1)[-1]
        statement = f"`{short}`, lines {d.lines[0]}-{d.lines[1]} ({d.label})"
        if d.path in tree_paths:
            head = f"- `{d.function}` ({statement}, `{d.path}` in the tree), {where}"
        else:
            head = (f"- [`{d.function}`]({permalink(release, d.path, d.def_lines)}) "
                    f"([{statement}]({permalink(release, d.path, d.lines)}), `{d.path}`), {where}")
        if d.role != "branch":
            head += f" — {d.role}"
        elif d.explained_by_setting:
            head += " — reads the differing setting itself"
        lines.append(head)
        lines += ["", "  ```python"] + [f"  {x}" for x in d.text.splitlines()] + ["  ```", ""]
        if d.role == "branch":
            lines.append(f"  witness: {_shown(d.witness)}; neighbour: {_shown(d.neighbour)}")
        else:
            lines.append(f"  {d.witness[0][1]}")
        if d.since:
            lines.append(f"  since: {since_text(d.since)}")
        lines.append("")
    return lines


SIMILAR = 0.5  # below this difflib ratio, the nearest statement is not shown as the same one changed


def since_text(since: dict) -> str:
    """One line: the first release of the statement's form, the form before it and after it."""
    first, oldest = since.get("first"), since.get("oldest")
    function = since.get("function", "the function")
    if since.get("before") is None and first == oldest:
        text = f"in this form since at least {first} (the oldest release checked)"
    else:
        text = f"in this form from {first}"
    for key, verb in (("before", "before, in {release}:"), ("after", "changed in {release} to")):
        entry = since.get(key)
        if not entry:
            continue
        if entry.get("note"):
            text += f"; {entry['release']}: {entry['note']}"
        elif entry.get("similarity", 0) >= SIMILAR:
            text += (f"; {verb.format(release=entry['release'])} `{_one_line(entry['text'])}` "
                     f"({entry['path']}:{entry['lines'][0]})")
        else:
            text += f"; no such statement in {entry['release']}'s `{function}` ({entry['path']})"
    if not since.get("after") and since.get("last"):
        text += f"; unchanged through {since['last']}"
    if since.get("unchecked"):
        text += f" (not checked: {', '.join(since['unchecked'])})"
    return text


def _one_line(text: str, width: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."
