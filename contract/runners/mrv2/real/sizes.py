"""Beside ``config/vllm.py``'s ``_set_cudagraph_sizes`` and ``v1/worker/gpu/cudagraph_utils.py``'s
``CudaGraphManager``: each ``SizeSetting`` of ``contract/core/sizes.py`` through vLLM's own code.

vLLM's own: ``VllmConfig.__post_init__`` with the setting's ``SchedulerConfig`` and
``CompilationConfig`` (the size derivation and, on 0.34, its split into prefill tokens and decode
requests), the manager's candidates (``_init_candidates``) and every batch's descriptor through
``dispatch_cg_and_sync_dp`` with one DP rank (``34:v1/worker/gpu/dp_utils.py:232-314``), called as
``execute_model`` calls it (``34:v1/worker/gpu/model_runner.py:1894-1912``: a uniform decode batch
with ``uniform_token_count = max_query_len = q``, any other with neither). Stood in for: the
speculative config (``contract/real/vllm_config.py``'s ``SpeculativeStandIn``, a draft with a
model), attached after post-init, after which ``_set_cudagraph_sizes`` runs again from the user's
sizes and the mode post-init handed it (the derivation reads ``uniform_decode_query_len``, which
reads the speculative config); and the capture itself:
the manager is marked captured, so ``dispatch`` serves from the descriptors it would capture.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging

from contract.core.sizes import Batch, SizeSetting, batches
from contract.real.errors import first_line, raised_at
from contract.real.vllm_config import MAX_MODEL_LEN, SpeculativeStandIn

# 0.34's split of the shared sizes (34:config/vllm.py:2558-2600): reset with the shared ones so the
# derivation runs from the user's settings again.
_SPLIT = ("prefill_cudagraph_capture_token_sizes", "max_prefill_cudagraph_capture_tokens",
          "decode_cudagraph_capture_request_sizes", "max_decode_cudagraph_capture_requests")
_DERIVED = ("cudagraph_capture_sizes", "max_cudagraph_capture_size", "prefill_cudagraph_capture_token_sizes",
            "decode_cudagraph_capture_request_sizes")


class _Lines(logging.Handler):
    """vLLM's warning and info lines while one setting is derived."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = record.getMessage()
        except Exception:  # noqa: BLE001 - a line that cannot be formatted says nothing here
            return
        if line not in self.lines:
            self.lines.append(line)


@contextlib.contextmanager
def _heard(handler: logging.Handler):
    """vLLM's log lines reach ``handler`` alone while the block runs, whatever level the run set."""
    logger = logging.getLogger("vllm")
    saved = logger.handlers[:], logger.level, logger.propagate
    logger.handlers, logger.propagate = [handler], False
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.handlers, logger.propagate = saved[0], saved[2]
        logger.setLevel(saved[1])


def _config(session, s: SizeSetting):
    from vllm.config import CompilationConfig, DeviceConfig, SchedulerConfig, VllmConfig

    kwargs: dict = {"cudagraph_mode": s.cudagraph_mode}
    if s.cudagraph_capture_sizes is not None:
        kwargs["cudagraph_capture_sizes"] = list(s.cudagraph_capture_sizes)
    if s.max_cudagraph_capture_size is not None:
        kwargs["max_cudagraph_capture_size"] = s.max_cudagraph_capture_size
    model_config = copy.deepcopy(session.configs.model_config())
    derive = VllmConfig._set_cudagraph_sizes
    entered = {}

    def entering(self):  # the mode post-init hands the derivation, which may set it to NONE
        entered["mode"] = self.compilation_config.cudagraph_mode
        return derive(self)

    VllmConfig._set_cudagraph_sizes = entering
    try:
        vllm_config = VllmConfig(
            model_config=model_config, compilation_config=CompilationConfig(**kwargs),
            scheduler_config=SchedulerConfig.default_factory(
                max_num_seqs=s.max_num_seqs, max_num_batched_tokens=s.max_num_batched_tokens,
                max_model_len=MAX_MODEL_LEN, enable_chunked_prefill=True),
            device_config=DeviceConfig(device="cuda"))
    finally:
        VllmConfig._set_cudagraph_sizes = derive
    if s.num_speculative_tokens:
        vllm_config.speculative_config = SpeculativeStandIn(
            num_speculative_tokens=s.num_speculative_tokens, enforce_eager=False, method="eagle",
            draft_model_config=model_config)
        cc = vllm_config.compilation_config
        cc.cudagraph_mode = entered.get("mode", cc.cudagraph_mode)
        cc.cudagraph_capture_sizes = list(s.cudagraph_capture_sizes) if s.cudagraph_capture_sizes is not None else None
        cc.max_cudagraph_capture_size = s.max_cudagraph_capture_size
        for name in _SPLIT:
            if hasattr(cc, name):
                setattr(cc, name, None)
        vllm_config._set_cudagraph_sizes()
    return vllm_config


def _manager(session, vllm_config):
    cc = vllm_config.compilation_config
    q = vllm_config.uniform_decode_query_len
    cls = session.cudagraph_utils.CudaGraphManager
    if "decode_query_lens" in inspect.signature(cls.__init__).parameters:  # 0.34
        manager = cls(vllm_config, session.torch_device, cc.cudagraph_mode,
                      decode_query_lens=vllm_config.get_decode_cudagraph_query_lens(q))
    else:  # 0.33
        manager = cls(vllm_config, session.torch_device, cc.cudagraph_mode, decode_query_len=q)
    manager._graphs_captured = True  # the capture is simulated: every candidate is a graph
    return manager


def _served(dispatch, manager, s: SizeSetting, b: Batch) -> list:
    decode = b.kind == "decode"
    desc, _ = dispatch(manager, b.num_reqs, b.num_tokens, s.q if decode else None, 1, 0,
                       max_query_len=s.q if decode else None)
    return [desc.cg_mode.name, desc.num_tokens, desc.num_reqs]


def observe(session, settings: list[SizeSetting]) -> list[dict]:
    """Per setting: what vLLM derived and logged, and the descriptor of every batch as runs of
    consecutive batches served alike (``[kind, first tokens, last tokens, mode, tokens, requests]``);
    or where vLLM refused the setting (``rejected``: a ``ValueError`` of its validation) or raised
    (``raised``, with the line and the ``phase``: deriving the config or dispatching)."""
    from vllm.v1.worker.gpu.dp_utils import dispatch_cg_and_sync_dp

    handler = _Lines()
    out = []
    for s in settings:
        handler.lines = []
        try:
            with _heard(handler):
                vllm_config = _config(session, s)
        except ValueError as exc:
            out.append({"setting": s.to_json(), "rejected": first_line(exc)})
            continue
        except Exception as exc:  # noqa: BLE001 - vLLM's code raised: a finding, reported with its line
            out.append({"setting": s.to_json(), "phase": "config", "raised": first_line(exc), "at": raised_at(exc)})
            continue
        cc = vllm_config.compilation_config
        record = {"setting": s.to_json(), "mode": cc.cudagraph_mode.name, "logged": handler.lines,
                  "derived": {name: getattr(cc, name) for name in _DERIVED if hasattr(cc, name)}, "served": []}
        try:
            manager = _manager(session, vllm_config)
            runs = record["served"]
            for b in batches(s):
                got = _served(dispatch_cg_and_sync_dp, manager, s, b)
                if runs and runs[-1][0] == b.kind and runs[-1][3:] == got:
                    runs[-1][2] = b.num_tokens
                else:
                    runs.append([b.kind, b.num_tokens, b.num_tokens, *got])
        except Exception as exc:  # noqa: BLE001 - as above; what it derived stands
            del record["served"]
            out.append({**record, "phase": "dispatch", "raised": first_line(exc), "at": raised_at(exc)})
            continue
        out.append(record)
    return out
