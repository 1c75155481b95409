"""What every policy is to the shared core, whichever runner it models: a name, the runner, where
it comes from, and its runner's model (``engine``). The families define the policies themselves
(``contract/runners/mrv1/model/policy.py``: a ``load_model`` wrapping rule; ``contract/runners/
mrv2/model/policy.py``: the MRV2 manager rules)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from contract.core.engine import Engine
from contract.core.output import one_line
from contract.core.scenario import ConfigRevision, Runner


class Policy(Protocol):
    name: str
    runner: Runner
    config_revision: ConfigRevision
    description: str
    source: str  # "built-in", or the path of the file or tree it was read from

    @property
    def engine(self) -> Engine: ...


class PolicyError(Exception):
    """A policy name or file that cannot be used; the message says what to do, in one line."""

    def __init__(self, message: str):
        super().__init__(one_line(message))


class UntrustedPolicyFile(PolicyError):
    """A trace names a policy file that the person running the command did not name."""


class BranchError(PolicyError):
    """A vLLM tree that cannot be read as a policy; the message is one line."""


@dataclass(frozen=True)
class Branch:
    """A vLLM tree's rules as a policy: what its runner family read (``where``), and the release
    whose rules they are, when they are one's (the rules alone: the rest of the tree may differ)."""

    policy: Policy
    where: str  # the code read: file:lines, ...
    release: str | None  # the release whose rules the read code is, or None
    tree: Path  # as given to --vllm-src
    package: Path  # its vllm/ package
    rules: str  # a digest of the code read: two trees with equal digests have the same rules
    what: str = "wrapping block"

    @property
    def read(self) -> str:
        if self.release is None:
            return f"{self.where}: not a release's {self.what}, run as a policy ({self.policy.name})"
        return f"{self.where}: vLLM {self.release}'s {self.what} (policy {self.policy.name})"
