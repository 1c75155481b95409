"""Exhaustive exploration: breadth-first search over the state graph of (scenario, runner state),
with events as edges, recorded in a networkx ``DiGraph``.

The bound is explicit: every canonical scenario of the policy's runner (one per behaviour class,
``canonical_scenarios`` of the policy's runner), batch sizes abstracted to the classes the dispatcher
distinguishes (``scenario.NUM_TOKENS_DOMAIN`` against capture sizes (2, 4)), and at most ``depth``
events. Serving events that replay change no state, so the search usually reaches a fixpoint
before the bound; the result says which.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import networkx as nx

from contract.core.classes import Occurrence, Signature, ViolationClass, classes_from, rejection, signatures
from contract.core.coverage import Cell, cells_of
from contract.core.policy import Policy
from contract.core.observation import StepRecord
from contract.core.properties import PROPERTIES, Violation, check, verdict_difference
from contract.core.engine import enabled, initial_state, step
from contract.core.scenario import Scenario
from contract.core.trace import Trace, record

DEFAULT_DEPTH = 12


@dataclass
class Exploration:
    policy: str
    depth: int
    scenarios: int
    states: int = 0
    transitions: int = 0
    complete: bool = True  # every reachable state was expanded within the bound
    seconds: float = 0.0
    counterexamples: dict[str, Trace] = field(default_factory=dict)  # property -> shortest trace
    cells: set[Cell] = field(default_factory=set)
    classes: list[ViolationClass] = field(default_factory=list)  # with ``classify``: every class, shortest witness
    # with ``classify``: per signature, its shortest witness in every scenario that shows it
    occurrences: dict[Signature, list[Occurrence]] = field(default_factory=dict)
    scenario_list: list[Scenario] = field(default_factory=list)
    # with ``classify``: vLLM's accepted rejections (not classes), minimal settings and shortest witness each
    rejections: list[ViolationClass] = field(default_factory=list)

    def classes_of(self, prop: str) -> list[ViolationClass]:
        return [c for c in self.classes if c.signature.property == prop]

    def holds(self, prop: str) -> bool:
        return prop not in self.counterexamples


def explore(policy: Policy, depth: int = DEFAULT_DEPTH, scenarios: list[Scenario] | None = None,
            only: frozenset[str] | None = None, base: Policy | None = None, first_only: bool = False,
            classify: bool = False) -> Exploration:
    """BFS from every scenario's initial state. Level order makes the first violation found for a
    property a shortest counterexample (ties broken by scenario order, then event order).
    ``first_only`` stops after the first scenario that shows a violation of a property of ``only``
    (of any, when ``only`` is None; a kill check: the counterexample is the shortest for that scenario,
    not necessarily overall).

    With ``base`` (a mutant's base policy), an edge counts as a violation where the two policies'
    verdicts differ, as in the Hypothesis machine's lockstep mode.

    ``classify`` enumerates every violation class reachable in the bound (``contract/core/classes.py``):
    the first witness of a signature in a scenario is its shortest there, by level order.
    """
    started = time.perf_counter()
    scenarios = scenarios if scenarios is not None else policy.engine.canonical_scenarios(policy)
    result = Exploration(policy.name, depth, len(scenarios), scenario_list=list(scenarios))
    wanted = set(only or PROPERTIES) | ({"halt"} if base is not None else set())
    found: dict[str, tuple[int, object, object, Violation]] = {}
    occurrences: dict[Signature, list[Occurrence]] = {}
    rejected: dict[Signature, list[Occurrence]] = {}
    for index, scenario in enumerate(scenarios):
        graph = nx.DiGraph()
        events = policy.engine.alphabet(scenario)
        root = ("root",)
        state = initial_state(scenario, policy)
        base_state = initial_state(scenario, base) if base is not None else None
        if classify and base is None and state.halted:
            # VllmConfig refused the settings before any step (a ValueError with advice)
            refused = rejection(StepRecord(0, None, halted=state.halted))
            if refused is not None:
                rejected.setdefault(refused, []).append(Occurrence(index, scenario, (), 0, state.halted))
        nodes = {root: (state, base_state)}
        graph.add_node(root)
        frontier = deque([(root, 0)])
        shown: set[Signature] = set()
        while frontier:
            node, level = frontier.popleft()
            state, base_state = nodes[node]
            if level >= depth:
                if any(enabled(scenario, policy, state, e) for e in events):
                    result.complete = False
                continue
            for event in events:
                if not enabled(scenario, policy, state, event):
                    continue
                new_state, rec = step(scenario, policy, state, event, level)
                result.transitions += 1
                violations = check(rec, scenario, policy.runner, only)
                new_base = None
                if base is not None:
                    violations, new_base = _lockstep(scenario, base, base_state, event, level, rec, violations)
                result.cells |= cells_of(scenario, new_state, rec)
                child = (new_state, new_base)
                key = ("s", new_state, new_base)
                if key not in nodes:
                    nodes[key] = child
                    graph.add_edge(node, key, event=event)
                    frontier.append((key, level + 1))
                if classify and base is None and (violations or rec.halted):
                    refused = rejection(rec)
                    found_here = signatures(rec, violations) + ([(refused, None)] if refused else [])
                    for sig, v in found_here:
                        if sig not in shown:
                            shown.add(sig)
                            path = nx.shortest_path(graph, root, node)
                            trail = tuple(graph.edges[a, b]["event"] for a, b in zip(path, path[1:])) + (event,)
                            (rejected if sig is refused else occurrences).setdefault(sig, []).append(Occurrence(
                                index, scenario, trail, level, v.message if v else rec.halted))
                for v in violations:
                    if v.property in wanted and (v.property not in found or found[v.property][0] > level + 1):
                        found[v.property] = (level + 1, index, (graph, node, event), v)
        result.states += len(nodes)
        if first_only and (found if only is None else only & found.keys()):
            result.complete = False
            break
    for prop, (_, index, (graph, node, event), violation) in sorted(found.items()):
        scenario = scenarios[index]
        path = nx.shortest_path(graph, ("root",), node)
        trail = [graph.edges[a, b]["event"] for a, b in zip(path, path[1:])] + [event]
        result.counterexamples[prop] = record(
            scenario, policy, trail, name=f"{policy.name}-{prop}", prop=prop,
            origin={"engine": "explorer", "depth": depth})
    result.occurrences = occurrences
    result.classes = witnessed_classes(occurrences, policy, depth)
    result.rejections = witnessed_classes(rejected, policy, depth)
    result.seconds = time.perf_counter() - started
    return result


def witnessed_classes(occurrences: dict[Signature, list[Occurrence]], policy: Policy,
                      depth: int = DEFAULT_DEPTH) -> list[ViolationClass]:
    """The classes of a set of occurrences, each witness recorded as a trace under ``policy``."""
    from contract.core.graphs import affected_share, run_script

    out = classes_from(occurrences, lambda o, sig: record(
        o.scenario, policy, list(o.events), prop=sig.property if sig.property in PROPERTIES else None,
        origin={"engine": "explorer", "depth": depth}),
        affected=lambda o, sig: affected_share(run_script(o.scenario, policy), o.scenario, policy.runner, sig))
    for c in out:
        c.witness.name = f"{policy.name}-{c.id}"
    return out


def _lockstep(scenario, base, base_state, event, level, rec, violations):
    """The differences between a mutant's step and its base's (``properties.verdict_difference``),
    and the base's next state."""
    if not enabled(scenario, base, base_state, event):
        return [Violation("halt", level, f"{event.kind} is possible under the mutant only")], base_state
    base_state, base_rec = step(scenario, base, base_state, event, level)
    diff = verdict_difference(violations, check(base_rec, scenario, base.runner), rec, base_rec, base.name)
    return ([diff] if diff else []), base_state
