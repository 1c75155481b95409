"""The import stubs for packages a CPU machine lacks (``contract/real/stub_library.py``)."""

from __future__ import annotations

import importlib
import importlib.util
import sys

from contract.real.stub_library import stubbed


def test_stubs_import_while_open_and_are_gone_after():
    with stubbed(("cgc_absent_pkg", "json")):
        module = importlib.import_module("cgc_absent_pkg.kernels")
        assert module.__name__ == "cgc_absent_pkg.kernels"
        assert isinstance(module.trtllm_decode, type)
        assert sys.modules["json"].__file__  # a package this machine has is imported as it is
    assert not [n for n in sys.modules if n.split(".")[0] == "cgc_absent_pkg"]
    assert importlib.util.find_spec("cgc_absent_pkg") is None
    assert "json" in sys.modules
