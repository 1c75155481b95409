"""Model Runner V1's model behind the core's ``Engine`` interface."""

from contract.core.engine import Engine
from contract.core.scenario import Runner
from contract.runners.mrv1.model import gpu_model_runner, space

ENGINE = Engine(
    runner=Runner.MRV1,
    initial_state=gpu_model_runner.initial_state,
    enabled=gpu_model_runner.enabled,
    step=gpu_model_runner.step,
    alphabet=space.alphabet,
    canonical_scenarios=space.canonical_scenarios,
    scenarios=space.scenarios,
    data_parallel=True,
)
