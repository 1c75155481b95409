"""pytest plugin ``cudagraph_contract``: each violation class a branch adds is a failing test item.

    pytest --cudagraph-contract-vllm-src . --cudagraph-contract-base auto

runs in vLLM's own CI: the tree's ``load_model`` wrapping block is verified exhaustively (the
explorer) and compared with the base (``--base`` of the command line: a release, a built-in
policy, a policy file or a tree; ``auto`` by default). Every *new* class becomes an item
``cudagraph_contract::new::<class>`` whose failure message is the class and its shortest witness;
with nothing new one passing item says so; changes the model does not read are a skipped item
``cudagraph_contract::<branch>::unread`` whose reason names them and the replay that runs them.
Every kind of dispatch the branch serves with fewer CUDA graphs than the base (lost graphs) is an
item ``cudagraph_contract::lost-graphs::<class>``, failing unless
``--cudagraph-contract-allow-lost-graphs``. ``--cudagraph-contract-profile ci`` also runs the
Hypothesis machine and fails on a counterexample whose class the base does not show.

Only code the person names runs: the tree given, and ``.py`` policy files given with
``--cudagraph-contract-policy`` or ``--cudagraph-contract-base``; nothing a trace or report names.
That code runs in a child process, never in pytest's (``contract.core.child``), for at most
``--cudagraph-contract-timeout`` seconds.
"""

from __future__ import annotations

import pytest

GROUP = "cudagraph-contract"


def pytest_addoption(parser) -> None:
    group = parser.getgroup(GROUP, "vLLM CUDA-graph dispatch contract (cudagraph-contract)")
    group.addoption("--cudagraph-contract-vllm-src", metavar="PATH", default=None,
                    help="a vLLM source tree whose load_model wrapping block is checked against the base")
    group.addoption("--cudagraph-contract-policy", metavar="FILE", action="append", default=[],
                    help="a .py policy file (or built-in policy name) to check against the base; repeatable")
    group.addoption("--cudagraph-contract-base", metavar="REV", default="auto",
                    help="auto (default), a release (0.30.0), a built-in policy, a .py policy file or a vLLM tree")
    group.addoption("--cudagraph-contract-runner", metavar="RUNNER", default="auto",
                    help="mrv1 or mrv2: which model runner of the tree to read (auto: the tree's own)")
    group.addoption("--cudagraph-contract-profile", metavar="NAME", default=None,
                    help="also run the Hypothesis machine with this profile (ci, dev, thorough)")
    group.addoption("--cudagraph-contract-allow-lost-graphs", action="store_true", default=False,
                    help="a branch serving fewer dispatches with a CUDA graph than the base passes (listed, not failed)")
    group.addoption("--cudagraph-contract-timeout", metavar="SECONDS", type=float, default=300.0,
                    help="seconds a policy file or the tree's rules may run in their child process: 1 to 604800 "
                         "(default 300)")


class ContractItem(pytest.Item):
    def __init__(self, *, outcome: str | None, unchecked: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.outcome = outcome  # None: passes; otherwise the failure text
        self.unchecked = unchecked  # what was not checked: the item is skipped, never passed

    def runtest(self) -> None:
        if self.unchecked is not None:
            pytest.skip(self.unchecked)
        if self.outcome is not None:
            raise ContractFailure(self.outcome)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ContractFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return GROUP, None, self.name


class ContractFailure(Exception):
    pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A skipped contract item is located at the plugin's group, not at the line that skips it."""
    outcome = yield
    report = outcome.get_result()
    if isinstance(item, ContractItem) and report.skipped and isinstance(report.longrepr, tuple):
        report.longrepr = (GROUP, None, report.longrepr[2])


def witness_text(c) -> str:
    return (f"{c.title}\n  shortest witness ({c.length} events): {c.events_text}\n  {c.message}\n"
            f"  scenario: {c.witness.scenario.to_json()}")


def _branches(config):
    from contract.branch import tree as branch
    from contract.core.child import set_time_limit
    from contract.families import check_unique, described, load_policy, named

    option = "--cudagraph-contract-timeout"
    try:
        set_time_limit(config.getoption(option), option)
    except ValueError as exc:
        raise pytest.UsageError(f"cudagraph-contract: {exc}") from None
    specs = list(dict.fromkeys(config.getoption("--cudagraph-contract-policy")))
    check_unique([named(spec) for spec in specs])
    out = []
    src = config.getoption("--cudagraph-contract-vllm-src")
    if src:
        tree = branch.load(src, runner=config.getoption("--cudagraph-contract-runner"))
        out.append((tree.policy, tree))
    out += [(load_policy(spec), None) for spec in specs]
    check_unique([described(p) for p, _ in out])
    return out


def _items(session, config) -> list[ContractItem]:
    from contract.branch import base as base_mod
    from contract.core.classes import of_trace
    from contract.core.differential import compare, shows
    from contract.core.policy import PolicyError

    items = []
    try:
        spec = base_mod.check(config.getoption("--cudagraph-contract-base"))
        branches = _branches(config)
        for policy, tree in branches:
            chosen = base_mod.resolve(spec, policy, tree)
            base = chosen.policy
            d = compare(policy, base)
            config._cudagraph_contract_lines.append(f"{policy.name}: {chosen.said}; {d.summary()}")
            unread = _unread(tree, chosen) if tree is not None else []
            config._cudagraph_contract_lines += unread
            if unread:
                items.append(ContractItem.from_parent(
                    session, name=f"cudagraph_contract::{policy.name}::unread", outcome=None, unchecked=unread[0]))
            for c in d.new:  # worst severity first
                items.append(ContractItem.from_parent(
                    session, name=f"cudagraph_contract::{policy.name}::new::{c.id}",
                    outcome=f"new in {policy.name} (not in {base.name}), {c.severity_text}: {witness_text(c)}"))
            allow = config.getoption("--cudagraph-contract-allow-lost-graphs")
            for c in d.lost:
                items.append(ContractItem.from_parent(
                    session, name=f"cudagraph_contract::{policy.name}::lost-graphs::{c.id}",
                    outcome=None if allow else f"lost graphs in {policy.name} (against {base.name}; pass "
                                               f"--cudagraph-contract-allow-lost-graphs to accept): {witness_text(c)}"))
            if not d.new:
                items.append(ContractItem.from_parent(
                    session, name=f"cudagraph_contract::{policy.name}::nothing-new", outcome=None))
            profile = config.getoption("--cudagraph-contract-profile")
            if profile:
                items += _hypothesis_items(session, policy, base, profile, of_trace, shows)
    except PolicyError as exc:
        raise pytest.UsageError(f"cudagraph-contract: {exc}") from None
    return items


def _unread(tree, chosen) -> list[str]:
    """The tree's changes the model does not read (as ``verify --vllm-src`` says them): never a silent
    pass, the command that replays them on vLLM's own code instead."""
    from contract.branch.review import VERIFY, review
    from contract.families import FAMILIES, by_runner

    r = review(tree, chosen, by_runner(tree.policy.runner))
    if unlisted := r.unlisted(FAMILIES):
        return [unlisted]
    unread = r.unread(VERIFY)
    if not unread:
        return []
    named = ", ".join(f"{path}: {name or 'module level'}" for path, name in unread)
    return [f"the model does not read {len(unread)} of the tree's changes ({named}); replay them on vLLM's own "
            f"code: {r.conform_command(FAMILIES)}"]


def _hypothesis_items(session, policy, base, profile, of_trace, shows) -> list[ContractItem]:
    from contract.core.profiles import get
    from contract.core.verify import verify_policy

    try:
        settings = get(profile)
    except ValueError as exc:
        raise pytest.UsageError(f"cudagraph-contract: {exc}") from None
    items = []
    for verdict in verify_policy(policy, settings).values():
        if verdict.trace is None:
            continue
        for c in of_trace(verdict.trace, policy):
            if not shows(base, c.witness.scenario, c.witness.events, c.signature):
                items.append(ContractItem.from_parent(
                    session, name=f"cudagraph_contract::{policy.name}::hypothesis::{c.id}",
                    outcome=f"Hypothesis ({profile}) found a class {base.name} does not show: {witness_text(c)}"))
    return items


def pytest_configure(config) -> None:
    config._cudagraph_contract_lines = []


def pytest_collection_modifyitems(session, config, items) -> None:
    if config.getoption("--cudagraph-contract-vllm-src") or config.getoption("--cudagraph-contract-policy"):
        items.extend(_items(session, config))


def pytest_report_header(config):
    if config.getoption("--cudagraph-contract-vllm-src") or config.getoption("--cudagraph-contract-policy"):
        return [f"cudagraph-contract: base {config.getoption('--cudagraph-contract-base')}"]
    return None


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    lines = getattr(config, "_cudagraph_contract_lines", [])
    if lines:
        terminalreporter.section("cudagraph-contract")
        for line in lines:
            terminalreporter.write_line(line)
