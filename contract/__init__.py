"""cudagraph-contract: a property-based verifier of vLLM's CUDA-graph dispatch contract.

Policy files import ``contract.api``; everything else is reached through the command line
(``contract.cli``), the pytest plugin (``contract.plugin``) and the runner families
(``contract.families``). docs/architecture.md describes the packages.
"""
