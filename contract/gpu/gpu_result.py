"""``scripts/gpu-conformance.sh``'s result: ``result.json``, ``result.md`` and the per-trace pages.

``python -m contract.gpu.gpu_result SUMMARY REPORTS OUT DEVICE SECONDS``: reads the
``conform --json`` summary and the conformance reports written under ``REPORTS``, and writes into
``OUT`` the run's result (machine, vLLM, corpus, steps agreeing, CUDA checks, time), one page per
replayed trace file (``traces/<name>.md``: steps, agreement, each disagreeing step's fields), and a
copy of the conformance pages (``conformance/``, ``findings.md``). ``OUT`` is the only folder that
comes back from a GPU machine.
"""

from __future__ import annotations

import json
import platform
import re
import shutil
import sys
from pathlib import Path


def machine(device: str) -> dict:
    import torch

    return {"host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None}


def result_markdown(result: dict) -> str:
    m = result["machine"]
    pct = "n/a" if result["agreement"] is None else f"{100 * result['agreement']:.2f}%"
    device = "real CUDA graphs" if result["device"] == "cuda" else "simulated CUDA graphs (cpu-sim)"
    lines = [f"# Conformance on {device}", "",
             f"- machine: {m['gpu'] or 'no GPU'}; Python {m['python']}, torch {m['torch']}, CUDA {m['cuda']}, "
             f"vLLM {result['vllm']} (Model Runner "
             f"{'V2' if (result.get('load_model_block') or {}).get('runner') == 'MRV2' else 'V1'})",
             f"- corpus: {result['trace_files']} trace files + {result['generated_traces']} generated "
             f"(corpus `{result['corpus']}`)",
             f"- steps: {result['agreeing_steps']} of {result['steps']} agree ({pct}); "
             f"disagreeing traces: {result['disagreeing_traces']}",
             f"- time: {result['seconds']} s"]
    if "device_checks" in result:
        c = result["device_checks"]
        lines.append(f"- CUDA: {c['graphs_captured']} graphs captured ({c['breakable_segments']} breakable segments, "
                     f"num_cudagraph_captured {c['num_cudagraph_captured']}); {c['replays_checked']} replays equal to "
                     f"eager (max relative error {c['max_rel_error']}); failures: {len(c['failures'])}")
        lines += [f"  - {f}" for f in c["failures"]]
    lines += ["", "Per trace file: `traces/`; the conformance report: `conformance/`."]
    return "\n".join(lines) + "\n"


def trace_page(trace: dict, disagreement: dict | None) -> str:
    lines = [f"# {trace['name']}", "", f"- source: `{trace['source']}`, recorded under `{trace['trace_policy']}`",
             f"- status: {trace['status']}" + (f" ({trace['note']})" if trace.get("note") else ""),
             f"- steps: {trace['agreeing']} of {trace['steps']} agree"]
    for d in (disagreement or {}).get("disagreements", []):
        lines += ["", f"## step {d['step']}: {d['event']}", "", "model:", "```json",
                  json.dumps(d["model"], indent=1), "```", "vLLM:", "```json", json.dumps(d["vllm"], indent=1), "```"]
    return "\n".join(lines) + "\n"


def write(summary_path: Path, reports: Path, out: Path, device: str, seconds: int) -> str:
    summary = json.loads(summary_path.read_text())
    summary.pop("report", None)
    result = {"device": device, "machine": machine(device), "seconds": seconds, **summary}
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "result.md").write_text(result_markdown(result))
    conformance = reports / "conformance"
    mrv2 = (summary.get("load_model_block") or {}).get("runner") == "MRV2"  # report.write's file name
    run = json.loads((conformance / f"vllm-{summary['vllm']}{'-mrv2' if mrv2 else ''}.json").read_text())
    disagreeing = {d["source"]: d for d in run.get("disagreements", [])}
    pages = out / "traces"
    pages.mkdir(exist_ok=True)
    for trace in run["traces"]:
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", trace["source"].removesuffix(".json"))
        (pages / f"{name}.md").write_text(trace_page(trace, disagreeing.get(trace["source"])))
    shutil.copytree(conformance, out / "conformance", dirs_exist_ok=True)
    if (reports / "findings.md").exists():
        shutil.copy(reports / "findings.md", out / "findings.md")
    pct = "n/a" if result["agreement"] is None else f"{100 * result['agreement']:.2f}%"
    return f"{out}/result.json: {pct} of {result['steps']} steps agree, {seconds} s"


if __name__ == "__main__":
    summary, reports, out, device, seconds = sys.argv[1:6]
    print(write(Path(summary), Path(reports), Path(out), device, int(seconds)))
