"""Model Runner V2's model behind the core's ``Engine`` interface."""

from contract.core.engine import Engine
from contract.core.scenario import Runner
from contract.runners.mrv2.model import model_runner, space

ENGINE = Engine(
    runner=Runner.MRV2,
    initial_state=model_runner.initial_state,
    enabled=model_runner.enabled,
    step=model_runner.step,
    alphabet=space.alphabet,
    canonical_scenarios=space.canonical_scenarios,
    scenarios=space.scenarios,
    uniform_propose=True,
    data_parallel=True,
)
