"""The requests a reproduction sends once ``vllm serve`` is up, when its witness needs a batch.

A witness whose violation happens at start-up (``load_model``, ``profile_run``,
``profile_cudagraph_memory``, ``resolve``, ``capture_model``) is reached by the serve command
alone. One that reaches ``execute_model`` or ``propose`` needs the batch that step stands for:

- ``propose(n)`` in MRV1: the drafter runs on the tokens the target scheduled in that step
  (``SpecDecodeBaseProposer.propose``, ``v1/spec_decode/llm_base_proposer.py``): in a decode step of
  ``r`` requests that is ``r * q`` tokens (``q = 1 + num_speculative_tokens``), in a request's first
  step its prompt. Batch sizes are abstracted to what the dispatcher tells apart against the capture
  sizes (2, 4) (``contract/core/scenario.py``), so any batch padded to the same size is the same witness.
- ``propose(n, uniform_decode)`` and ``execute_model(n, uniform_decode)`` in MRV2: a target batch
  of ``n`` tokens in which every request has ``q`` tokens, i.e. ``n / q`` requests decoding
  together; without ``uniform_decode``, a prefill of ``n`` tokens.

Decode steps of ``r`` requests are made by ``r`` concurrent requests with short prompts and enough
``max_tokens`` to decode together for many steps; a prefill of exactly ``n`` tokens by a prompt
given as ``n`` token ids (the completions endpoint takes a list of ids; nothing is added to it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from contract.core.events import ExecuteModel, Propose
from contract.core.scenario import CUDAGRAPH_CAPTURE_SIZES, MAX_NUM_SEQS, Runner

PORT = 8000
TOKEN_ID = 100  # a token id every stored checkpoint's vocabulary has
PROMPT = "The capital of France is"
DECODE_TOKENS = 64  # enough decode steps for the requests to run together after their prefills


@dataclass(frozen=True)
class Need:
    """The batch a witness step needs, stated plainly, and the requests that make it."""

    step: int
    what: str  # the batch, in words
    requests: int  # how many requests, sent together
    prompt_ids: int | None  # prompt of exactly this many token ids (a prefill); None: a short text
    max_tokens: int
    adapters: int = 0  # the first this many requests each name a LoRA adapter of their own


def padded(n: int) -> int | None:
    """The capture size a batch of ``n`` tokens is padded to; None above the largest."""
    return next((c for c in sorted(CUDAGRAPH_CAPTURE_SIZES) if n <= c), None)


def violating_step(trace) -> int:
    """The step of the trace's first recorded violation of its property; a halt's last step."""
    for v in trace.expected_violations:
        if v.get("property") == trace.property:
            return int(v["step"])
    return len(trace.events) - 1


def need(trace) -> Need | None:
    """What the witness's violating step needs after start-up; None when start-up reaches it."""
    step = violating_step(trace)
    event = trace.events[step] if 0 <= step < len(trace.events) else None
    if not isinstance(event, (ExecuteModel, Propose)):
        return None
    q = trace.scenario.uniform_decode_query_len
    n = event.num_tokens
    who = "the drafter proposes over" if isinstance(event, Propose) else "the target runs"
    k = getattr(event, "num_active_loras", 0)
    adapters = f", {k} of them each naming a LoRA adapter of its own (adapter-1 .. adapter-{k})" if k else ""
    if trace.scenario.runner is Runner.MRV2 or isinstance(event, ExecuteModel):
        if event.uniform_decode:
            r = max(1, n // q)
            return Need(step, f"a decode step of {_requests(r)}{adapters}, each with {q} tokens "
                              f"(1 + {q - 1} speculative): a uniform batch of {r * q} tokens; {who} it",
                        r, None, DECODE_TOKENS, k)
        if k:  # as many prefilling requests as the batch has, sharing its tokens
            r = min(n, MAX_NUM_SEQS)
            return Need(step, f"a prefill step of {_requests(r)}{adapters}, {n} prompt tokens in all; {who} it",
                        r, -(-n // r), 1, k)
        return Need(step, f"a prefill of exactly {n} prompt tokens in one step; {who} it", 1, n, 1)
    # MRV1 propose: the drafter's batch is the target's scheduled tokens of that step
    for r in range(1, MAX_NUM_SEQS + 1):
        if padded(r * q) == padded(n):
            size = padded(n)
            return Need(step, f"a decode step of {_requests(r)}: the target verifies {r * q} tokens "
                              f"({r} x (1 + {q - 1} speculative)) and the drafter proposes over them, a drafter "
                              + (f"batch padded to {size} tokens" if size else "batch above the largest capture size"),
                        r, None, DECODE_TOKENS)
    return Need(step, f"a request's first step with a prompt of exactly {n} tokens: the drafter proposes over "
                      "the prompt", 1, n, 2)


def _requests(r: int) -> str:
    return "one request" if r == 1 else f"{r} requests together"


def curl(model: str, need: Need) -> str:
    """The requests, as shell: ``need.requests`` completions sent together, then wait."""
    body = {"model": model, "prompt": [TOKEN_ID] * need.prompt_ids if need.prompt_ids else PROMPT,
            "max_tokens": need.max_tokens, "temperature": 0}
    if need.adapters:  # request i names adapter-i while i <= adapters (--lora-modules adapter-i=PATH)
        body["model"] = "MODEL"
    request = (f"curl -s http://localhost:{PORT}/v1/completions -H 'Content-Type: application/json' "
               f"-d '{json.dumps(body)}'")
    if need.adapters:
        request = request.replace('"MODEL"', '"\'"$m"\'"')
        pick = f'm={model}; [ $i -le {need.adapters} ] && m=adapter-$i'
        return f"for i in $(seq {need.requests}); do\n  {pick}\n  {request} &\ndone; wait"
    if need.requests == 1:
        return request
    return f"for i in $(seq {need.requests}); do\n  {request} &\ndone; wait"


def markdown(trace, model: str) -> list[str]:
    """The request section of a reproduction page."""
    found = need(trace)
    if found is None:
        return ["The violation happens during `vllm serve`'s start-up: the command alone reaches it, no request is needed."]
    event = trace.events[found.step]
    return [f"The violation is at step {found.step} (`{event.kind}`), after start-up: it needs {found.what}. "
            f"Once the server answers (`curl localhost:{PORT}/health`), send "
            + ("these requests together" if found.requests > 1 else "this request") + ":",
            "", "```bash", curl(model, found), "```"]
