"""Edited copies of an installed release's ``vllm/`` package, as a reviewer's branch would be: one
small edit per area the runner families read or replay. Each edit replaces an exact statement of
the release's source and fails loudly when the release no longer has it."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from vllm_envs import installed


@dataclass(frozen=True)
class Edit:
    path: str  # under vllm/
    old: str
    new: str
    why: str  # what the edit breaks, in vLLM's terms


# Model Runner V2, per release: the mode decisions (v1/worker/gpu/model_runner.py), the manager
# (v1/worker/gpu/cudagraph_utils.py), a speculator's manager construction (v1/worker/gpu/spec_decode/)
# and resolve (config/compilation.py).
EDITS: dict[tuple[str, str], Edit] = {
    ("0.34.0", "model_runner"): Edit(
        "v1/worker/gpu/model_runner.py",
        "        piecewise_capture_available = bool(\n"
        "            is_breakable_cudagraph_enabled(self.vllm_config.compilation_config)\n"
        "            or has_compiled_submodule(self.model)\n        )",
        "        piecewise_capture_available = True",
        "initialize_kv_cache keeps PIECEWISE for a model with no compiled submodule"),
    ("0.33.0", "model_runner"): Edit(
        "v1/worker/gpu/model_runner.py",
        "        piecewise_capture_available = bool(\n"
        "            envs.VLLM_USE_BREAKABLE_CUDAGRAPH or has_compiled_submodule(self.model)\n        )",
        "        piecewise_capture_available = True",
        "initialize_kv_cache keeps PIECEWISE for a model with no compiled submodule"),
    ("0.34.0", "cudagraph_utils"): Edit(
        "v1/worker/gpu/cudagraph_utils.py",
        "        if not self.use_breakable_cg:\n            # Default: Use torch-compiled piecewise cudagraph.\n"
        "            return model(**model_inputs)",
        "        if True:\n            return model(**model_inputs)",
        "run_pw_graph calls the model instead of the breakable runner"),
    ("0.33.0", "cudagraph_utils"): Edit(
        "v1/worker/gpu/cudagraph_utils.py",
        "        if not self.use_breakable_cg:\n            # Default: Use torch-compiled piecewise cudagraph.\n"
        "            return model(**model_inputs)",
        "        if True:\n            return model(**model_inputs)",
        "run_pw_graph calls the model instead of the breakable runner"),
    ("0.34.0", "dispatch"): Edit(
        "v1/worker/gpu/cudagraph_utils.py",
        "                if n < len(decode_descs):\n",
        "                if n <= len(decode_descs):\n",
        "dispatch indexes past the largest decode graph for a uniform decode batch just past it: IndexError "
        "when serving"),
    ("0.34.0", "unreached"): Edit(
        "v1/worker/gpu/cudagraph_utils.py",
        "        num_unpadded_tokens=num_tokens,\n",
        "        num_unpadded_tokens=num_tokens + 0,\n",
        "make_cudagraph_stats, which execute_model calls after the dispatch in a part the replay does not run"),
    ("0.34.0", "sizes"): Edit(
        "config/vllm.py",
        "                        range(8, min(max_cudagraph_capture_size + 1, 256), 8)\n",
        "                        range(8, min(max_cudagraph_capture_size, 256), 8)\n",
        "_set_cudagraph_sizes stops the 8-stride one short: a default ceiling on the stride (128 at "
        "--max-num-seqs 64) is no longer captured"),
    ("0.34.0", "unconfigured"): Edit(
        "v1/worker/gpu/cudagraph_utils.py",
        "        mixed_mode = self.cudagraph_mode.mixed_mode()\n",
        "        mixed_mode = self.cudagraph_mode.max_cudagraph_mode()\n",
        "_init_candidates captures FULL token-keyed graphs under FULL_DECODE_ONLY, a mode the user did not "
        "configure for mixed batches"),
    ("0.34.0", "spec_decode"): Edit(
        "v1/worker/gpu/spec_decode/autoregressive/speculator.py",
        "        if self.prefill_cudagraph_manager.use_breakable_cg:\n"
        "            self.prefill_cudagraph_manager.init_breakable_cg_runner(self.model)",
        "        pass",
        "the speculator's capture builds no breakable runner for its prefill manager"),
    ("0.33.0", "spec_decode"): Edit(
        "v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py",
        "        if self.prefill_cudagraph_manager.use_breakable_cg:\n"
        "            self.prefill_cudagraph_manager.init_breakable_cg_runner(self.model)",
        "        pass",
        "the speculator's capture builds no breakable runner for its prefill manager"),
    ("0.34.0", "resolve"): Edit(
        "config/compilation.py",
        "            if self.splitting_ops_contain_attention():\n"
        "                msg += \"; setting cudagraph_mode=FULL_AND_PIECEWISE\"",
        "            if True:\n                msg += \"; setting cudagraph_mode=FULL_AND_PIECEWISE\"",
        "resolve upgrades FULL to FULL_AND_PIECEWISE with attention not in the splitting ops"),
    ("0.33.0", "resolve"): Edit(
        "config/compilation.py",
        "            if self.splitting_ops_contain_attention():\n"
        "                msg += \"; setting cudagraph_mode=FULL_AND_PIECEWISE\"",
        "            if True:\n                msg += \"; setting cudagraph_mode=FULL_AND_PIECEWISE\"",
        "resolve upgrades FULL to FULL_AND_PIECEWISE with attention not in the splitting ops"),
}


def copy(release: str, dest: Path) -> Path:
    """The release's ``vllm/`` under ``dest`` (hard links: files are replaced, never written through),
    its bytecode with it as in a checkout that has run: an edited file's no longer matches it and
    is compiled again."""
    tree = dest / "vllm"
    shutil.copytree(installed(release), tree, copy_function=lambda s, d: _link(s, d))
    return dest


def _link(src, dst) -> None:
    try:
        Path(dst).hardlink_to(src)
    except OSError:
        shutil.copy2(src, dst)


def apply(root: Path, edit: Edit) -> None:
    path = root / "vllm" / edit.path
    text = path.read_text(encoding="utf-8")
    assert text.count(edit.old) == 1, f"{edit.path} no longer has the statement this edit replaces"
    path.unlink()  # the copy is a hard link to the release's file
    path.write_text(text.replace(edit.old, edit.new), encoding="utf-8")


def edited(release: str, area: str, dest: Path) -> Path:
    root = copy(release, dest)
    apply(root, EDITS[(release, area)])
    return root
