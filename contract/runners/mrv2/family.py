"""Model Runner V2 (``v1/worker/gpu/``): vLLM 0.33 (its default runner) and later (the only one from 0.34)."""

from contract.core.family import Family
from contract.core.forward_context import BatchDescriptor
from contract.core.scenario import Runner, Scenario
from contract.real import attention_backends
from contract.real.attention_op import ATTENTION_MODULE
from contract.real.installed import release
from contract.runners.mrv2 import branch
from contract.runners.mrv2.model.cudagraph_utils import BED
from contract.runners.mrv2.model.engine import ENGINE
from contract.runners.mrv2.model.model_runner import skips_profiling
from contract.runners.mrv2.model.policies import built_in
from contract.runners.mrv2.real import conform, sizes
from contract.runners.mrv2.real.modules import MODULES, SPECULATORS


def release_policy(release: tuple[int, int]) -> str:
    """The release's own reading: 0.33 ``mrv2_0_33``, 0.34 and later ``mrv2_0_34``."""
    return "mrv2_0_33" if release < (0, 34) else "mrv2_0_34"


def descriptor_from_json(data: dict, mode):
    """MRV2 dispatches record ``BatchExecutionDescriptor``s; a forward outside any manager (the
    profile run's eager pass) records a plain ``BatchDescriptor``."""
    return BED.from_json(data, mode) if "uniform_token_count" in data else BatchDescriptor.from_json(data)


def profiling_skipped(scenario: Scenario, version: str) -> bool:
    """Where the release's own reading (its built-in policy) has ``profile_cudagraph_memory``
    return 0: 0.34's extensible KV cache, which measures the graphs after warm-up."""
    return skips_profiling(scenario, built_in(release_policy(release(version))))


FAMILY = Family(
    name="mrv2",
    runner=Runner.MRV2,
    title="Model Runner V2",
    engine=ENGINE,
    policies=("mrv2_0_33", "mrv2_0_34"),
    built_in=built_in,
    first_release=(0, 33),
    last_release=None,
    release_policy=release_policy,
    corpus=conform.generated,
    conform=conform.run,
    session=conform.session,
    descriptor_from_json=descriptor_from_json,
    profiling_skipped=profiling_skipped,
    # What the replay imports first, its speculators, and the modules those call into that the
    # replay's decision paths cite (graph_capture, get_uniform_decode_token_count), and the stand-in
    # models' attention (unified_attention_with_output, contract/real/attention_op.py), and the attention
    # backends whose support getters run (contract/real/attention_backends.py): their code runs too.
    replays=(MODULES + (SPECULATORS, "vllm.distributed.parallel_state", "vllm.v1.worker.utils", ATTENTION_MODULE)
             + attention_backends.MODULES),
    markers=(branch.MANAGER_FILE,),
    read_tree=branch.load,
    reads=branch.READS,
    sizes=sizes.SIZES,
)
