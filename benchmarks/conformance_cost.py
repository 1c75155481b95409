"""What replaying on vLLM's real code costs against running the model, per step, in one run.

Run inside a vLLM venv from the repo root:

    PYTHONPATH=. .venv-vllm-0.30.0/bin/python benchmarks/conformance_cost.py [--traces N] [--repeat R]

The traces are the runner family's generated corpus (``Family.corpus``), the first N of them
(default all). The model side runs each trace's events (``contract.core.engine.Run``) under the
installed release's policy; the real side replays the same events on vLLM's code
(``Family.session().replay``); ``--runner`` picks the family as ``conform`` does. vLLM's start-up (imports, platform) is timed
apart and left out of the steps-per-second figures. Prints the numbers and the ratio; the target
is real/model <= 50.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from contract.core.engine import Run  # noqa: E402
from contract.families import for_release, load_policy, policy_for  # noqa: E402
from contract.real.installed import installed_version  # noqa: E402

TARGET_RATIO = 50


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=None, help="first N generated traces (default: all)")
    parser.add_argument("--repeat", type=int, default=3, help="timed passes per side; the best is kept")
    parser.add_argument("--runner", default="auto", help="mrv1, mrv2 or auto (vLLM's default for the release)")
    args = parser.parse_args()

    version = installed_version()
    family = for_release(version, args.runner)
    policy = load_policy(policy_for(version, args.runner))
    traces = list(itertools.islice(family.corpus(policy), args.traces))
    steps = sum(len(t.events) for t in traces)

    def model_pass() -> None:
        for t in traces:
            run = Run(t.scenario, policy)
            for event in t.events:
                run.apply(event)

    started = time.perf_counter()
    session = family.session()
    startup = time.perf_counter() - started

    def real_pass() -> None:
        for t in traces:
            session.replay(t.scenario, t.events)

    real_pass()  # warm: the first config per config key is built here
    best = {}
    for side, fn in (("model", model_pass), ("real", real_pass)):
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        best[side] = min(times)

    model_rate, real_rate = steps / best["model"], steps / best["real"]
    ratio = best["real"] / best["model"]
    print(f"vLLM {version} (policy {policy.name}): {len(traces)} traces, {steps} steps per pass, best of {args.repeat}")
    print(f"vLLM start-up (imports, platform, wrapping block): {startup:.1f} s")
    print(f"model: {model_rate:,.0f} steps/s ({best['model']:.2f} s per pass)")
    print(f"real:  {real_rate:,.0f} steps/s ({best['real']:.2f} s per pass)")
    verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
    print(f"ratio real/model: {ratio:.1f}x (target <= {TARGET_RATIO}x: {verdict})")


if __name__ == "__main__":
    main()
