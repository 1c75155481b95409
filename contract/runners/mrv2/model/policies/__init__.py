"""The MRV2 releases' rules, one module each defining ``POLICY``."""

import importlib


def built_in(name: str):
    """A built-in MRV2 policy: ``contract/runners/mrv2/model/policies/<name>.py`` defines ``POLICY``."""
    return importlib.import_module(f"contract.runners.mrv2.model.policies.{name}").POLICY
