"""Model Runner V1 (``v1/worker/gpu_model_runner.py``): vLLM up to 0.33 (removed in 0.34)."""

from contract.core.family import Family
from contract.core.forward_context import BatchDescriptor
from contract.core.scenario import Runner
from contract.real import attention_backends
from contract.real.attention_op import ATTENTION_MODULE
from contract.runners.mrv1 import branch
from contract.runners.mrv1.model.engine import ENGINE
from contract.runners.mrv1.model.policy_file import built_in
from contract.runners.mrv1.real import conform, replay, sizes


def release_policy(release: tuple[int, int]) -> str:
    """0.29.x and earlier: ``vllm_0_29``; 0.30 to 0.33 (#56312 merged): ``vllm_0_30``."""
    return "vllm_0_30" if release >= (0, 30) else "vllm_0_29"


FAMILY = Family(
    name="mrv1",
    runner=Runner.MRV1,
    title="Model Runner V1",
    engine=ENGINE,
    policies=("vllm_0_29", "pr56312_draft", "vllm_0_30"),
    built_in=built_in,
    first_release=(0, 0),
    last_release=(0, 33),
    release_policy=release_policy,
    corpus=conform.generated,
    conform=conform.run,
    session=conform.session,
    descriptor_from_json=lambda data, mode: BatchDescriptor.from_json(data),
    profiling_skipped=lambda scenario, version: False,  # every release profiles what it captures
    # What the replay imports first, and the modules those call into that the replay's decision paths
    # cite (graph_capture, ubatch_utils.maybe_create_ubatch_slices), and the stand-in models' attention
    # (unified_attention_with_output, contract/real/attention_op.py), and the attention backends whose
    # support getters run (contract/real/attention_backends.py): their code runs too.
    replays=(replay.MODULES + ("vllm.distributed.parallel_state", "vllm.v1.worker.ubatch_utils", ATTENTION_MODULE)
             + attention_backends.MODULES),
    markers=(branch.RUNNER_FILE,),
    read_tree=branch.load,
    reads=branch.READS,
    sizes=sizes.SIZES,
)
