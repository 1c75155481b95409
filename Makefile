# The two entry points: `make verify` (verify the built-in policies, write reports/) and
# `make test` (the test suite, real-vLLM conformance included). Both start from nothing.
PYTHON ?= python3
VENV := .venv
VLLM_VERSIONS := 0.29.0 0.30.0 0.33.0 0.34.0
VLLM_ENVS := $(foreach v,$(VLLM_VERSIONS),.venv-vllm-$(v)/.complete)
# make test runs vLLM's code of the newest release alone (0.34.0, Model Runner V2); the other releases'
# runs are make evidence's.
TEST_ENVS := .venv-vllm-0.34.0/.complete
# Releases the pages cite but make test does not run: their Python source only (scripts/vllm_source.py).
SOURCE_VERSIONS := 0.28.0 0.29.0 0.30.0 0.31.0 0.32.0 0.33.0
SOURCES := .vllm-src
VLLM_SOURCES := $(foreach v,$(SOURCE_VERSIONS),$(SOURCES)/$(v)/vllm)

.PHONY: verify test evidence test-lowest vllm-envs gpu-conformance gpu-rehearsal gpu-rehearsal-mrv2 conformance-all findings fixes bugs clean

$(VENV)/.installed: pyproject.toml ci-constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -c ci-constraints.txt -e '.[test]'
	touch $@

verify: $(VENV)/.installed
	$(VENV)/bin/cudagraph-contract report --profile ci --out reports

# The environments are made by the package itself (contract/real/envs.py, `cudagraph-contract env
# make`), here in the repository's own folders rather than the user cache folder. envs.py needs the
# standard library alone, so it runs from the checkout beside the making of .venv.
ENV_MAKE := PYTHONPATH=$(CURDIR) $(PYTHON) -m contract.real.envs

.venv-vllm/.complete: contract/real/envs.py contract/real/constraints.txt
	$(ENV_MAKE) base --dir .venv-vllm --python $(PYTHON)
	touch $@

# One venv per release holding only its vLLM package, over .venv-vllm's torch and closure.
.venv-vllm-%/.complete: .venv-vllm/.complete
	$(ENV_MAKE) $* --dir .venv-vllm-$* --base .venv-vllm
	touch $@

# The releases download and unpack side by side: mostly network and disk, little CPU.
vllm-envs: .venv-vllm/.complete
	$(MAKE) -j4 $(VLLM_ENVS) $(VLLM_SOURCES)

$(SOURCES)/%/vllm: | $(VENV)/.installed
	$(VENV)/bin/python scripts/vllm_source.py $* $(SOURCES)

# The environments side by side (.venv-vllm beside .venv: contract/real/envs.py needs the standard library alone).
test:
	$(MAKE) -j4 -Otarget $(VENV)/.installed $(TEST_ENVS) $(VLLM_SOURCES)
	$(VENV)/bin/python -m compileall -q contract tests  # read by each of the suite's few hundred processes
	CONTRACT_REQUIRE_VLLM=1 CONTRACT_VLLM_SOURCES=$(CURDIR)/$(SOURCES) $(VENV)/bin/python -m pytest --hypothesis-profile=ci -n 2 --dist loadgroup -m "not campaign and not evidence"

# CI runs it after make test: the older releases' runs (0.29.0, 0.30.0's Model Runner V1 replays, 0.33.0),
# every shipped fix's verdict, every branch-review edit, the GPU bundles and the installed wheel, as
# `pytest -m evidence`, with the lowest-version run beside the environments (docs/measurements.md).
evidence: $(VENV)/.installed
	$(MAKE) -j4 -Otarget vllm-envs test-lowest
	CONTRACT_REQUIRE_VLLM=1 CONTRACT_VLLM_SOURCES=$(CURDIR)/$(SOURCES) $(VENV)/bin/python -m pytest --hypothesis-profile=ci -n 2 --dist loadgroup -m evidence

# The lowest versions pyproject.toml allows (ci-lowest.txt, installed --no-deps), and the command-line
# tests run there once: the declared lower bounds are the ones that pass.
LOWEST := .venv-lowest
LOWEST_TESTS := tests/test_cli.py tests/test_bad_input.py tests/test_cli_public.py tests/test_pytest_plugin.py

$(LOWEST)/.installed: pyproject.toml ci-lowest.txt
	rm -rf $(LOWEST)
	$(PYTHON) -m venv $(LOWEST)
	$(LOWEST)/bin/python -m pip install -q --no-deps -r ci-lowest.txt
	$(LOWEST)/bin/python -m pip install -q --no-deps -e .
	touch $@

test-lowest: $(LOWEST)/.installed
	$(LOWEST)/bin/python -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning $(LOWEST_TESTS) \
	  -k "not hypothesis_profile_adds_its_own_items"  # the plugin's Hypothesis run; verify's runs there

gpu-conformance: $(VENV)/.installed
	bash scripts/gpu-conformance.sh

# The GPU run rehearsed on this CPU machine: Python 3.12, torch 2.11.0, the GPU machine's packages,
# the bundle as carried (0.30.0 and 0.34.0), NVML and triton emulated (scripts/gpu-rehearsal.sh,
# reports/gpu/README.md). GPU_VLLM picks the release replayed: 0.30.0 (Model Runner V1) or 0.34.0
# (Model Runner V2, also `make gpu-rehearsal-mrv2`).
GPU_VLLM ?= 0.30.0

gpu-rehearsal: .venv-vllm-0.30.0/.complete .venv-vllm-0.34.0/.complete
	GPU_REHEARSAL_VLLM=$(GPU_VLLM) bash scripts/gpu-rehearsal.sh

gpu-rehearsal-mrv2:
	$(MAKE) gpu-rehearsal GPU_VLLM=0.34.0

# Not in CI: the affected-release matrix. Every release from 0.28.0 to 0.34.0 gets its environment
# (the same .venv-vllm-% rule as make test) and a full replay; a release whose environment does not
# build or whose runner the replay does not cover is named and skipped. Then the pages are rewritten
# from the new reports/conformance/.
ALL_VLLM_VERSIONS := 0.28.0 0.29.0 0.30.0 0.31.0 0.32.0 0.33.0 0.34.0

# Each release with its default runner, and 0.33.0 (the one release with both) with Model Runner V1 too.
ALL_REPLAYS := $(foreach v,$(ALL_VLLM_VERSIONS),$(v):auto) 0.33.0:mrv1

conformance-all: $(VENV)/.installed
	-$(MAKE) -k $(foreach v,$(ALL_VLLM_VERSIONS),.venv-vllm-$(v)/.complete)
	@for spec in $(ALL_REPLAYS); do \
	  v=$${spec%%:*}; r=$${spec##*:}; \
	  $(VENV)/bin/cudagraph-contract conform --vllm $$v --runner $$r --corpus full; rc=$$?; \
	  [ $$rc -le 1 ] || echo "conformance-all: vLLM $$v ($$r) not replayed (exit $$rc)"; \
	done
	$(MAKE) findings
	$(MAKE) verify

# Not in CI: the deciding lines of every confirmed finding, one child per replayed release tracing
# all its witnesses and their neighbours (reports/conformance/deciding/), then findings.md and the
# root-cause pages (reports/root-causes/), which render from those files alone.
FINDINGS_REPLAYS := 0.28.0:mrv1 0.29.0:mrv1 0.30.0:mrv1 0.31.0:mrv1 0.32.0:mrv1 0.33.0:mrv1 0.33.0:mrv2 0.34.0:mrv2

findings: $(VENV)/.installed
	@for spec in $(FINDINGS_REPLAYS); do \
	  v=$${spec%%:*}; r=$${spec##*:}; \
	  [ -f reports/conformance/vllm-$$v$$([ $$r = mrv2 ] && echo -mrv2).json ] || continue; \
	  $(VENV)/bin/python -m contract.evidence.deciding_batch --vllm $$v --runner $$r || exit 1; \
	done
	$(VENV)/bin/python -m contract.reports.root_causes

# Not in CI: fix-check on every patch and wrong fix under fixes/, each on its release; the verdicts go
# into each fix.json (fix_check), shown on the root-cause pages. make test checks the newest of each.
fixes: $(VENV)/.installed vllm-envs
	$(VENV)/bin/python scripts/fix_checks.py
	$(VENV)/bin/python -m contract.reports.root_causes

# The corpus of real vLLM bugs (bugs/), each re-injected into its release and checked as a branch:
# reports/bugs.md (the recall, what to model next) and each bug's README. make evidence checks that
# every bug recorded as found still is (`cudagraph-contract bugs --check`).
bugs: $(VENV)/.installed vllm-envs
	$(VENV)/bin/cudagraph-contract bugs

clean:
	rm -rf $(VENV) $(LOWEST) .venv-vllm .venv-vllm-* $(SOURCES) .hypothesis .pytest_cache
