"""The log lines vLLM prints on a scenario's start-up path, from vLLM's own message templates.

Each line is the template of one ``logger`` call on the config-time and resolve path, filled in the
way vLLM formats it (``CUDAGraphMode.__str__`` is the name; ``CompilationMode`` is an ``IntEnum``, so
``%s`` prints its number; ``AttentionCGSupport`` is a plain ``Enum``, so an f-string prints
``AttentionCGSupport.NAME``). Sites are found by their text in each release's source
(``release_facts.json``), so a line can be cited at the release it was printed by.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.core.modes import FULL, FULL_AND_PIECEWISE, FULL_DECODE_ONLY, NONE, PIECEWISE, AttentionCGSupport, CompilationMode
from contract.core.scenario import ConfigRevision, Scenario, SplittingOps

# key -> a fragment of the template unique in vLLM's source (found per release in release_facts).
SITES: dict[str, tuple[str, str]] = {
    "normalise_none": ("config/vllm.py", '"Overriding to NONE."'),
    "normalise_without_piecewise": ("config/vllm.py", '"Cudagraph mode %s is not compatible with compilation mode %s. "'),
    "empty_splitting_piecewise": ("config/compilation.py", '"Using piecewise cudagraph with empty splitting_ops"'),
    "empty_splitting_none": ("config/compilation.py", '"mode to NONE. Hint: If you are using attention "'),
    "empty_splitting_full": ("config/compilation.py", '"cudagraph_mode to FULL."'),
    "resolve_mixed": ("config/compilation.py", '"; setting cudagraph_mode=FULL_AND_PIECEWISE"'),
    "resolve_decode_never": ("config/compilation.py", '"; setting cudagraph_mode=PIECEWISE because "'),
    "resolve_spec_decode": ("config/compilation.py", '" with spec-decode for attention backend "'),
    "resolve_raise": ("config/compilation.py", '"; please try cudagraph_mode=PIECEWISE, and "'),
}


@dataclass(frozen=True)
class LogLine:
    level: str  # "INFO", "WARNING", "ERROR"
    text: str
    site: str  # key of SITES


def _revision(release: str) -> ConfigRevision:
    return ConfigRevision.V0_29 if int(release.split(".")[1]) < 30 else ConfigRevision.V0_30


def start_up_lines(scenario: Scenario, release: str, backend_class: str) -> list[LogLine]:
    """Config-time normalisation (``VllmConfig.__post_init__``, ``set_splitting_ops_for_v1``),
    then ``resolve_cudagraph_mode_and_sizes`` with ``backend_class`` as the minimum-support backend."""
    out: list[LogLine] = []
    mode = scenario.cudagraph_mode
    compilation_mode = CompilationMode.NONE if scenario.breakable else scenario.compilation_mode
    if mode.requires_piecewise_compilation() and compilation_mode != CompilationMode.VLLM_COMPILE and not scenario.breakable:
        if _revision(release) is ConfigRevision.V0_29:
            out.append(LogLine("INFO", f"Cudagraph mode {mode.name} is not compatible with compilation mode "
                                       f"{compilation_mode.value}.Overriding to NONE.", "normalise_none"))
            mode = NONE
        else:
            fallback = mode.without_piecewise()
            out.append(LogLine("INFO", f"Cudagraph mode {mode.name} is not compatible with compilation mode "
                                       f"{compilation_mode.value}. Overriding to {fallback.name}.",
                               "normalise_without_piecewise"))
            mode = fallback
    contains_attention = scenario.splitting_ops is SplittingOps.ATTENTION
    if compilation_mode == CompilationMode.VLLM_COMPILE:
        contains_attention = scenario.splitting_ops is not SplittingOps.EMPTY
        if scenario.splitting_ops is SplittingOps.EMPTY:
            if mode in (PIECEWISE, FULL_AND_PIECEWISE):
                out.append(LogLine("WARNING", "Using piecewise cudagraph with empty splitting_ops",
                                   "empty_splitting_piecewise"))
            if mode == PIECEWISE:
                out.append(LogLine("WARNING", "Piecewise compilation with empty splitting_ops does not contain "
                                              "piecewise cudagraph. Setting cudagraph_mode to NONE. Hint: If you "
                                              "are using attention backends that support cudagraph, consider "
                                              "manually setting cudagraph_mode to FULL or FULL_DECODE_ONLY to "
                                              "enable full cudagraphs.", "empty_splitting_none"))
                mode = NONE
            elif mode == FULL_AND_PIECEWISE:
                out.append(LogLine("WARNING", "Piecewise compilation with empty splitting_ops does not contain "
                                              "piecewise cudagraph. Setting cudagraph_mode to FULL.",
                                   "empty_splitting_full"))
                mode = FULL
    return out + resolve_lines(mode, compilation_mode, contains_attention, scenario.attention_support,
                               backend_class, scenario.uniform_decode_query_len)


def resolve_lines(mode, compilation_mode, contains_attention: bool, support: AttentionCGSupport,
                  backend_class: str, q: int) -> list[LogLine]:
    """The three warning branches of ``resolve_cudagraph_mode_and_sizes`` and its first raise, in
    source order (``config/compilation.py:1388-1470`` in 0.29.0; the templates are unchanged from
    0.28.0 to 0.34.0)."""
    out: list[LogLine] = []
    if mode == NONE:
        return out
    level = f"AttentionCGSupport.{support.name}"
    if mode.mixed_mode() == FULL and support != AttentionCGSupport.ALWAYS:
        msg = f"CUDAGraphMode.{mode.name} is not supported with {backend_class} backend (support: {level})"
        if support == AttentionCGSupport.NEVER:
            return out + [LogLine("ERROR", "ValueError: " + msg + "; please try cudagraph_mode=PIECEWISE, and make "
                                           "sure compilation mode is VLLM_COMPILE", "resolve_raise")]
        mode = FULL_AND_PIECEWISE if contains_attention else FULL_DECODE_ONLY
        out.append(LogLine("WARNING", msg + f"; setting cudagraph_mode={mode.name}", "resolve_mixed"))
    if mode.decode_mode() == FULL and support == AttentionCGSupport.NEVER:
        msg = f"CUDAGraphMode.{mode.name} is not supported with {backend_class} backend (support: {level})"
        if compilation_mode == CompilationMode.VLLM_COMPILE and contains_attention:
            mode = PIECEWISE
            msg += "; setting cudagraph_mode=PIECEWISE because attention is compiled piecewise"
        else:
            mode = NONE
            msg += "; setting cudagraph_mode=NONE because attention is not compiled piecewise"
        out.append(LogLine("WARNING", msg, "resolve_decode_never"))
    if mode.decode_mode() == FULL and q > 1 and support.value < AttentionCGSupport.UNIFORM_BATCH.value:
        msg = (f"CUDAGraphMode.{mode.name} is not supported with spec-decode for attention backend "
               f"{backend_class} (support: {level})")
        mode = PIECEWISE if contains_attention else NONE
        out.append(LogLine("WARNING", msg + f"; setting cudagraph_mode={mode.name}", "resolve_spec_decode"))
    return out
