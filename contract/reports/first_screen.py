"""The first screen of a root-cause page: what a maintainer decides on before scrolling.

The title in a user's words, the severity and the measured impact, the ``vllm serve`` command that
reaches it on one GPU with the checks it passed (or why no command does), the expected symptom,
the affected releases and runners (a runner 0.34 no longer has is *backport only*), the fix in one
sentence and the deciding line: the statement the fix edits.

**The command** is ``reproduction.choose``'s: among the root cause's witnesses and the releases its
matrix confirms, newest first, the first that runs on one GPU; ``repro_check`` runs it through that
release's own parser, config, backend selection and support-level code, as it does the class pages'.

**The impact** is measured on the model of the witness's release, which agrees with vLLM's code
step for step on the conformance corpus (the corpus replays this very script): the share of the
fixed serving script's dispatches (``contract/core/graphs.py``: every token count, uniform or not,
and the drafter's proposals) that show the violation, per kind of dispatch.
"""

from __future__ import annotations

from pathlib import Path

from contract.core.classes import Severity, Signature
from contract.core.graphs import affected_by_kind, dispatch_kind, run_script, served
from contract.core.scenario import Runner
from contract.core.trace import TraceError, load
from contract.evidence import deciding, reproduction
from contract.evidence import root_causes as rc
from contract.evidence.matrix import RELEASES
from contract.evidence.release_facts import CAPABILITY_GPUS, span
from contract.families import load_policy

ROOT = Path(__file__).resolve().parents[2]
SCREEN = 25  # lines: what the first screen must hold
CHECKS = ("`vllm serve`'s own argument parser (`FlexibleArgumentParser` with `EngineArgs.add_cli_args`); "
          "`EngineArgs.create_engine_config()`, whose `VllmConfig` must hold the scenario's runner, modes, "
          "speculative config and KV-cache setting; the attention backend selection (`get_attn_backend`) for the "
          "target and the draft model and the backends' `get_cudagraph_support`, on each GPU named; the model's "
          "architecture and whether it reaches a compiled submodule, from its Hugging Face `config.json` and the "
          "release's source")


def _measure(unit: rc.Unit, root: Path) -> tuple[int, int, str]:
    """(dispatches hit, serving dispatches, per kind) of a witness's scenario on the serving script:
    those showing its violation, or, for a violation at capture, those a graph of its role and
    mode then serves (the graph the violation is about)."""
    trace = load(root / unit.home.source)
    policy = load_policy(trace.policy)
    sig = unit.home.signature
    signature = Signature(sig["property"], sig.get("role", "-"), sig.get("runtime_mode", "-"), sig.get("what", ""),
                          sig.get("detail", ""))
    records = run_script(trace.scenario, policy)
    counts = affected_by_kind(records, trace.scenario, policy.runner, signature)
    if not any(h for h, _ in counts.values()):
        counts = {}
        for r in records:
            for d in r.dispatches:
                kind = dispatch_kind(r.event, d)
                if kind is not None:
                    hit, total = counts.get(kind, (0, 0))
                    counts[kind] = (hit + (d.role == signature.role and d.runtime_mode.name == signature.runtime_mode
                                           and served(d)), total + 1)
    hit, total = sum(h for h, _ in counts.values()), sum(t for _, t in counts.values())
    return hit, total, ", ".join(f"{k}s {h} of {t}" for k, (h, t) in counts.items() if h)


WHAT = {Severity.EAGER_FALLBACK: "run eagerly instead of replaying a graph",
        Severity.UNWANTED_GRAPH: "replay a graph the configuration rules out",
        Severity.UNSUPPORTED_SHAPE: "replay FULL graphs captured for shapes the attention backend does not state it "
                                    "supports",
        Severity.LOG_ONLY: "are served by another capturer than the mode names",
        Severity.MEMORY: "replay graphs memory profiling did not estimate"}


def impact(cause: rc.RootCause, witness: str, root: Path = ROOT) -> str:
    """The measured share of serving dispatches the violation takes (for the command's scenario and
    across the root cause's classes), or what a crash loses."""
    sev = cause.severity
    if sev is Severity.CRASH_START_UP:
        return "vLLM stops at start-up: the server never serves."
    units = [u for u in cause.units if u.is_class or u.home.source == witness]
    if not units:
        return "not measured: no confirmed witness"
    measured = {}
    for u in units:
        try:
            measured[u.home.source] = _measure(u, root)
        except (TraceError, OSError):
            continue
    if not measured:
        return "not measured: no witness trace at hand"
    shown = measured.get(witness) or next(iter(measured.values()))
    hit, total, kinds = shown
    if sev is Severity.CRASH_SERVING:
        return f"vLLM stops when serving, at the first dispatch that reaches it: {kinds or 'the drafter'}."
    shares = sorted(100 * h / t for h, t, _ in measured.values() if t)
    spread = (f"; {shares[0]:.0f}% to {shares[-1]:.0f}% across the scenarios of its {len(measured)} witnesses"
              if len(measured) > 1 and shares[0] != shares[-1] else "")
    what = WHAT.get(sev, "show it")
    head = (f"{hit} of {total} serving dispatches ({100 * hit / total:.0f}%) {what} in the command's scenario: {kinds}"
            if hit else f"the graphs are captured at start-up, but none of the {total} serving dispatches of the "
            "command's scenario replays them")
    return (f"{head}{spread} (the model of the witness's release, which vLLM's code agrees with step for step, on "
            "the fixed serving script of `contract/core/graphs.py`).")


def ranges(releases: list[str]) -> str:
    """0.28.0, 0.29.0, 0.30.0, 0.32.0 -> 0.28–0.30, 0.32 (consecutive releases joined)."""
    out, run = [], []
    for r in RELEASES:
        if r in releases:
            run.append(r)
        elif run:
            out.append(run)
            run = []
    if run:
        out.append(run)
    short = [".".join(r.split(".")[:2]) for r in RELEASES]
    name = dict(zip(RELEASES, short))
    return ", ".join(name[g[0]] if len(g) == 1 else f"{name[g[0]]}–{name[g[-1]]}" for g in out)


def affected_line(cells: dict) -> str:
    """``MRV2 0.33–0.34 (current)``; ``MRV1 0.28–0.33 (backport only: ...)``."""
    per: dict[str, list[str]] = {}
    for (runner, _), row in sorted(cells.items()):
        for release, c in row.items():
            if c.state == rc.CONFIRMED and release not in per.setdefault(runner, []):
                per[runner].append(release)
    parts = []
    newest = RELEASES[-1]
    for runner, releases in sorted(per.items()):
        if not releases:
            continue
        current = Runner(runner) in rc.RUNNERS_IN[newest]
        note = ("current: in vLLM " + newest if current and newest in releases else
                "fixed in vLLM " + newest if current else
                f"**backport only**: vLLM {newest} has no {rc.RUNNER_FILES[Runner(runner)]}")
        parts.append(f"{runner} {ranges(releases)} ({note})")
    return "; ".join(parts) or "none confirmed"


def deciding_line(known: rc.Known | None) -> str:
    """The statement the fix edits, on the newest release it patches, linked."""
    if known is None or not known.fix_edits:
        return ""
    release = max(known.fix_edits, key=lambda r: tuple(map(int, r.split("."))))
    edits = known.fix_edits[release]
    if not edits:
        return ""
    anchored = [e for e in edits if any((a.path, a.function) == (e["path"], e["function"]) for a in known.anchors)]
    same_file = [e for e in edits if any(a.path == e["path"] for a in known.anchors)]
    edit = (anchored or same_file or [e for e in edits if e["function"]] or edits)[0]
    link = deciding.permalink(release, edit["path"], [edit["line"], edit["end"]])
    where = f" in `{edit['function']}`" if edit["function"] else ""
    more = f" (and {len(edits) - 1} more statement{'s' if len(edits) > 2 else ''} the patch edits)" if len(edits) > 1 else ""
    return f"[`{edit['path']}:{edit['line']}`]({link}) `{edit['text']}`{where}, vLLM {release}: the statement the fix edits{more}"


def where(capabilities) -> str:
    """``compute capability 8.0 to 12.1 (H100, H200, GH200: 9.0)``."""
    text = span(capabilities).removeprefix("every compute capability (").removesuffix(")")
    return f"compute capability {text}" + (f" ({CAPABILITY_GPUS['9.0']}: 9.0)" if "9.0" in capabilities else "")


def lines(cause: rc.RootCause, cells: dict, status: str, root: Path = ROOT) -> list[str]:
    known = cause.known
    title = known.headline if known is not None and known.headline else cause.title
    repro = reproduction.choose(cause, cells, root)
    out = [f"# {title}", "",
           f"`{cause.id}` · **{cause.severity.label}** · {status}", "",
           f"- **Impact (measured):** {impact(cause, repro.witness, root)}",
           f"- **Affected:** {affected_line(cells)}"]
    if repro.command is not None:
        plan = repro.command.plan
        gpus = "one NVIDIA GPU" if repro.one_gpu else f"{plan.gpus} NVIDIA GPUs ({repro.reason})"
        out += [f"- **Reproduce** with vLLM {repro.release} on {gpus} of {where(plan.capabilities)}:", "",
                "```bash", repro.command.shell(), "```", "",
                f"- **Checked** on vLLM {repro.release}'s own code on CPU (`tests/test_engine_check.py`): {CHECKS}; "
                f"weights: {plan.weights}. The model is not downloaded or run."]
    else:
        out += [f"- **Reproduce:** no `vllm serve` command reaches it with the stored public checkpoints: "
                f"{repro.reason}. vLLM's unit test below reproduces it on CPU."]
    if known is not None:
        if known.symptom:
            out.append(f"- **Expected:** {known.symptom}")
        fix = known.fix or known.mechanism
        accepted = [p for p, v in known.fix_check.items() if v == "accepted"]
        gpu = (f" Before and after on a GPU: `bash {known.folder}/gpu.sh` (not run: no GPU here)."
               if known.gpu and repro.command is not None and repro.release in known.patches else "")
        out.append(f"- **Fix:** {fix} [Patches](../../{known.folder}/)"
                   + (f"; `fix-check` accepted {', '.join(sorted(accepted))}." if accepted else ".") + gpu)
        line = deciding_line(known)
        if line:
            out.append(f"- **Deciding line:** {line}.")
    out += ["- Below: [affected matrix](#affected-matrix), [since when](#since-when), "
            "[reproduction on vLLM's code](#reproduction), [deciding lines](#deciding-lines-per-release), "
            "[classes](#classes), [fix and unit test](#fix-and-unit-test)."]
    return out
