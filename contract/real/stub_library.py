"""An import finder for packages absent on a CPU machine whose names vLLM's modules import at module
level (FlashInfer's kernels, ``flashinfer``): every name is a placeholder class, and nothing the
caller runs calls one. ``engine_check`` (config and support levels per GPU) and the replay's
FlashInfer backend (``attention_backends.py``) import through it."""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import sys
import types


class StubLibrary:
    def __init__(self, packages: tuple[str, ...]) -> None:
        self.packages = packages
        self.made: list[str] = []  # the stub modules created, so that closing forgets them alone

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.packages:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        class Placeholder(type):
            def __getattr__(cls, attr):
                if attr.startswith("__"):
                    raise AttributeError(attr)
                return Placeholder(attr, (), {"__init__": lambda self, *a, **k: None})

        class Stub(types.ModuleType):
            __path__: list = []

            def __getattr__(self, attr):
                if attr.startswith("__"):
                    raise AttributeError(attr)
                value = Placeholder(attr, (), {"__init__": lambda self, *a, **k: None})
                setattr(self, attr, value)
                return value

        self.made.append(spec.name)
        return Stub(spec.name)

    def exec_module(self, module):
        module.__version__ = "0.0.0+stub"


@contextlib.contextmanager
def stubbed(packages: tuple[str, ...]):
    """``packages`` importable as stubs while open; afterwards they are absent again, so that
    vLLM's later availability checks (``find_spec``) answer as on this machine. A package this
    machine has is imported as it is."""
    packages = tuple(p for p in packages if p not in sys.modules and importlib.util.find_spec(p) is None)
    finder = StubLibrary(packages)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        # only stubs can have these names (the packages are absent here); walking sys.modules
        # instead cost the replay a sixth of its time, once per attention group built
        for name in finder.made:
            sys.modules.pop(name, None)
