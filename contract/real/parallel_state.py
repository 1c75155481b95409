"""vLLM's parallel state for one rank, built from vLLM's own ``GroupCoordinator`` class."""

from __future__ import annotations


def install_parallel_state() -> None:
    """World-size-1 ``GroupCoordinator`` objects for the groups the orchestration reads
    (``get_world_group``, ``get_tp_group``, ``get_pp_group``, ``get_dp_group``: 0.30.0's
    ``graph_capture`` enters the DP group too), without ``torch.distributed``:
    ``graph_capture`` (``distributed/parallel_state.py``) and ``is_first_rank``/``is_last_rank``
    run vLLM's own code on them; ``device_communicator`` is None as on a single rank."""
    import vllm.distributed.parallel_state as ps

    def group(name: str):
        g = ps.GroupCoordinator.__new__(ps.GroupCoordinator)
        g.__dict__.update(unique_name=name, rank=0, ranks=[0], world_size=1, local_rank=0,
                          rank_in_group=0, device_communicator=None, cpu_group=None, device_group=None,
                          use_device_communicator=False, mq_broadcaster=None)
        return g

    for attr, name in (("_WORLD", "world"), ("_TP", "tp"), ("_PP", "pp"), ("_DP", "dp")):
        if getattr(ps, attr, None) is None:
            setattr(ps, attr, group(name))
