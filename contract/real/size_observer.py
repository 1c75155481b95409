"""Each ``SizeSetting`` of ``contract/core/sizes.py`` through vLLM's own config code, for a runner's
size check (``contract/runners/<runner>/real/sizes.py``), which names what the runner does with
the derived sizes (``prepare``: the dispatcher or manager start-up builds) and how it serves a batch.

vLLM's own: ``VllmConfig.__post_init__`` with the setting's ``SchedulerConfig`` and
``CompilationConfig`` (the size derivation and, on 0.34, its split into prefill tokens and decode
requests). Stood in for: the speculative config (``contract/real/vllm_config.py``'s
``SpeculativeStandIn``, a draft with a model), attached after post-init, after which
``_set_cudagraph_sizes`` runs again from the user's sizes and the mode post-init handed it (the
derivation reads ``uniform_decode_query_len``, which reads the speculative config).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable

from contract.core.sizes import SizeSetting, batches
from contract.real.errors import first_line, raised_at
from contract.real.vllm_config import MAX_MODEL_LEN, SpeculativeStandIn

# 0.34's split of the shared sizes (34:config/vllm.py:2558-2600): reset with the shared ones to the
# user's settings (None where not given) so the derivation runs from them again.
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
    if s.decode_cudagraph_capture_request_sizes is not None:
        kwargs["decode_cudagraph_capture_request_sizes"] = list(s.decode_cudagraph_capture_request_sizes)
    model_config = copy.deepcopy(session.configs.model_config())
    model_config.enforce_eager = s.enforce_eager
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
        schedule = s.num_speculative_tokens_per_batch_size
        vllm_config.speculative_config = SpeculativeStandIn(
            num_speculative_tokens=s.num_speculative_tokens, enforce_eager=False, method="eagle",
            draft_model_config=model_config,
            num_speculative_tokens_per_batch_size=[list(r) for r in schedule] if schedule is not None else None)
        cc = vllm_config.compilation_config
        cc.cudagraph_mode = entered.get("mode", cc.cudagraph_mode)
        cc.cudagraph_capture_sizes = list(s.cudagraph_capture_sizes) if s.cudagraph_capture_sizes is not None else None
        cc.max_cudagraph_capture_size = s.max_cudagraph_capture_size
        for name in _SPLIT:
            if hasattr(cc, name):
                setattr(cc, name, kwargs.get(name))
        vllm_config._set_cudagraph_sizes()
    return vllm_config


def _derived(vllm_config) -> dict:
    """The derived lists, by vLLM's names; one the derivation left unset (None) is left out."""
    cc = vllm_config.compilation_config
    return {name: getattr(cc, name) for name in _DERIVED if getattr(cc, name, None) is not None}


def observe(session, settings: list[SizeSetting], prepare: Callable, serve: Callable[..., list]) -> list[dict]:
    """Per setting: what vLLM derived and logged (after ``prepare(session, vllm_config)``, which
    builds what serves the batches, may refine the lists and raise as start-up raises), and the
    descriptor of every batch (``serve(prepared, setting, batch) -> [mode, tokens, requests]``) as
    runs of consecutive batches served alike (``[kind, first tokens, last tokens, mode, tokens,
    requests]``); or where vLLM refused the setting (``rejected``: a ``ValueError`` of its
    validation) or raised (``raised``, with the line and the ``phase``: ``config`` at start-up,
    ``dispatch`` serving; what it derived until then stands)."""
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
        record = {"setting": s.to_json(), "mode": vllm_config.compilation_config.cudagraph_mode.name,
                  "logged": handler.lines, "derived": _derived(vllm_config)}
        try:
            with _heard(handler):
                prepared = prepare(session, vllm_config)
        except ValueError as exc:
            out.append({"setting": s.to_json(), "rejected": first_line(exc)})
            continue
        except Exception as exc:  # noqa: BLE001 - as above
            out.append({**record, "phase": "config", "raised": first_line(exc), "at": raised_at(exc)})
            continue
        record.update(mode=vllm_config.compilation_config.cudagraph_mode.name, derived=_derived(vllm_config))
        runs: list[list] = []
        try:
            for b in batches(s):
                got = serve(prepared, s, b)
                # a run holds batches of rising token counts (decode batches under dynamic
                # speculative decoding can fall back to fewer tokens per request)
                if runs and runs[-1][0] == b.kind and runs[-1][3:] == got and b.num_tokens > runs[-1][2]:
                    runs[-1][2] = b.num_tokens
                else:
                    runs.append([b.kind, b.num_tokens, b.num_tokens, *got])
        except Exception as exc:  # noqa: BLE001 - as above; what it derived stands
            out.append({**record, "phase": "dispatch", "raised": first_line(exc), "at": raised_at(exc)})
            continue
        out.append({**record, "served": runs})
    return out

