"""``cudagraph-contract env``: make, list and locate the vLLM environments ``conform`` replays in
(``contract/real/envs.py``), so an installed package needs no checkout.

Exit 0 on success, 2 when a step fails or an environment is missing (one line naming it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from contract.cli.common import err, fail, say

app = typer.Typer(
    no_args_is_help=True,
    help="Make, list and locate the vLLM environments conform replays in: one shared environment (torch and "
         "the pinned closure, 'base') and one small environment per release.",
)


@app.command("make")
def make(
    version: str = typer.Argument(..., metavar="VERSION|base", help="A vLLM release (0.34.0) or base (the shared "
                                  "environment)."),
    folder: Optional[Path] = typer.Option(None, "--dir", metavar="PATH", help="Make it in this folder. Default: "
                                          ".venv-vllm-VERSION (.venv-vllm for base) in $CUDAGRAPH_CONTRACT_ENVS, "
                                          "else in the user cache folder (env list shows it)."),
    base: Optional[Path] = typer.Option(None, "--base", metavar="PATH", help="The shared environment a release "
                                        "runs over (made first when missing). Default: .venv-vllm beside the "
                                        "release's folder."),
    python: Optional[str] = typer.Option(None, "--python", metavar="PATH", help="The interpreter the shared "
                                         "environment is made from. Default: the one running this command."),
) -> None:
    """Make an environment, or complete one; re-running skips every step already done.

    Example: [bold]cudagraph-contract env make 0.34.0[/]
    """
    from contract.real import envs
    from contract.real.installed import SHARED, envs_dir

    try:
        envs.check_version(version)
        name = SHARED if version == "base" else f"{SHARED}-{version}"
        dest = folder if folder is not None else envs_dir() / name
        lines = envs.make(version, dest, base, python, say=lambda line: err.print(f"{line} ...", markup=False,
                                                                                    highlight=False))
    except envs.EnvProblem as exc:
        fail(str(exc))
    for line in lines:
        say(line)


@app.command("list")
def list_(
    as_json: bool = typer.Option(False, "--json", help="Print them as JSON."),
) -> None:
    """The environments found, in the order they are looked for, and where a new one goes."""
    from contract.real.installed import COMPLETE, SHARED, envs_dir, search_path

    found = []
    for folder in search_path():
        for env in sorted(folder.glob(f"{SHARED}*")):
            if env.name == SHARED or env.name.startswith(f"{SHARED}-"):
                found.append({"version": env.name[len(SHARED) + 1:] or "base", "path": str(env),
                              "complete": (env / COMPLETE).exists() and (env / "bin" / "python").exists()})
    if as_json:
        sys.stdout.write(json.dumps({"search_path": [str(f) for f in search_path()], "new": str(envs_dir()),
                                     "environments": found}, indent=1) + "\n")
        return
    say(f"looked for in: {', '.join(str(f) for f in search_path())}")
    say(f"env make puts new ones in: {envs_dir()}")
    for e in found:
        say(f"{e['version']:<10} {e['path']}" + ("" if e["complete"] else "  (incomplete: run env make again)"))
    if not found:
        say("none yet: cudagraph-contract env make 0.34.0")


@app.command("path")
def path(
    version: str = typer.Argument(..., metavar="VERSION|base", help="A vLLM release (0.34.0) or base."),
) -> None:
    """Print the interpreter of an environment (exit 2 when it does not exist).

    Example: [bold]"$(cudagraph-contract env path 0.34.0)" -c 'import vllm'[/]
    """
    from contract.real import envs
    from contract.real.installed import environment, missing, shared_environment

    try:
        envs.check_version(version)
    except envs.EnvProblem as exc:
        fail(str(exc))
    python = shared_environment() if version == "base" else environment(version)
    if not python.exists():
        fail(missing(version))
    typer.echo(str(python))
