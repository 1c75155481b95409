"""What a command read of a branch: the tree's changes against its base, and for each whether this
command exercises it. ``verify --vllm-src`` reads a few statements (the family's ``reads``);
``conform --vllm-src`` runs every module the family's replay imports (``replays``), the tree's in
place of the release's.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.branch import diff as diff_mod
from contract.branch.base import Base, family_files
from contract.core.family import Family
from contract.core.policy import Branch

VERIFY, CONFORM = "verify", "conform"
MAX_LISTED = 12


@dataclass(frozen=True)
class Review:
    tree: Branch
    base: Base
    family: Family
    diff: diff_mod.TreeDiff | None  # None: no base package on this machine to compare with
    replayed: frozenset[str]  # files under vllm/ that the family's replay runs

    @property
    def read_changed(self) -> bool:
        """The statements verify reads differ from the base's rules."""
        return self.tree.release is None or self.tree.release != self.base.release

    def exercised(self, path: str, qualname: str | None, command: str) -> str:
        if command == VERIFY:
            if (path, qualname) in self.family.reads:
                return "read by verify" if self.read_changed else "verify reads part of it, unchanged there"
            return "not read by verify"
        return "replayed" if path in self.replayed else "not replayed (outside the modules the replay imports)"

    def lines(self, command: str) -> list[str]:
        """The summary a branch run opens with."""
        head = f"{self.tree.tree} ({self.family.title}): {self.base.said}"
        if self.diff is None:
            return [head, "  no base source on this machine to compare the tree with: its changes are not listed"]
        if not self.diff.files:
            return [head, "  the tree's files equal the base's"]
        out = [head, f"  {self.diff.summary()}:"]
        listed = 0
        for f in self.diff.files:
            if listed >= MAX_LISTED:
                out.append(f"  ... and {len(self.diff.files) - MAX_LISTED} more files (the report lists them all)")
                break
            listed += 1
            if not f.functions:
                what = "module level changed" if f.module_level else f.kind
                out.append(f"  {f.path}: {what}: {self.exercised(f.path, None, command)}")
                continue
            for fn in f.functions:
                out.append(f"  {f.path}: {fn.qualname} {fn.kind}: {self.exercised(f.path, fn.qualname, command)}")
            if f.module_level:
                out.append(f"  {f.path}: module level changed: {self.exercised(f.path, None, command)}")
        return out

    def unread(self, command: str) -> list[tuple[str, str | None]]:
        """Changed code this command does not exercise: (file, function or None for the module level)."""
        if self.diff is None:
            return []
        found = []
        for f in self.diff.files:
            names = [fn.qualname for fn in f.functions] + ([None] if f.module_level or not f.functions else [])
            for name in names:
                said = self.exercised(f.path, name, command)
                if said.startswith("not"):
                    found.append((f.path, name))
        return found

    def unlisted(self, families) -> str | None:
        """Where no base package is on this machine to compare with, no change can be named as read
        or not: what to run instead, never a silent pass."""
        if self.diff is not None:
            return None
        return ("no base source on this machine to compare the tree with: the changes the model does not read "
                f"cannot be named, and are unchecked; replay the tree on vLLM's own code: {self.conform_command(families)}")

    def conform_command(self, families) -> str:
        """The ``conform --vllm-src`` command that replays the tree's changes on vLLM's own code: with
        ``--runner`` where the tree also holds another of ``families`` (0.30 to 0.33 hold both runners,
        and the default is vLLM's for the release) whose replay imports more of the changed files
        (``UBatchWrapper``'s file is Model Runner V1's alone)."""
        command = f"cudagraph-contract conform --vllm-src {self.tree.tree} --base {self.base.release or 'auto'}"
        if self.diff is None or self.base.package is None:
            return command
        changed = {f.path for f in self.diff.files}
        mine = changed & self.replayed
        for other in families:
            if other is self.family or not any((self.tree.package / m).is_file() for m in other.markers):
                continue
            if mine < changed & set(family_files(other, self.base.package)):
                return f"{command} --runner {other.name}"
        return command

    @property
    def recognised(self) -> bool:
        """The tree is its base release for this family: the files it reads and replays are the release's."""
        return self.diff is not None and not any(f.path in self.replayed or f.path in self._read_files
                                                 for f in self.diff.files)

    @property
    def _read_files(self) -> set[str]:
        return {path for path, _ in self.family.reads}


def review(tree: Branch, base: Base, family: Family) -> Review:
    if base.package is None:
        return Review(tree, base, family, None, frozenset())
    return Review(tree, base, family, diff_mod.compare(tree.package, base.package),
                  frozenset(family_files(family, base.package)))
