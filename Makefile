# The two entry points: `make verify` (verify the built-in policies, write reports/) and
# `make test` (the test suite, real-vLLM conformance included). Both start from nothing.
PYTHON ?= python3
VENV := .venv
VLLM_VERSIONS := 0.29.0 0.30.0
VLLM_ENVS := $(foreach v,$(VLLM_VERSIONS),.venv-vllm-$(v)/.complete)

.PHONY: verify test vllm-envs gpu-conformance conformance-all clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e '.[test]'
	touch $@

verify: $(VENV)/.installed
	$(VENV)/bin/cudagraph-contract report --profile ci --out reports

.venv-vllm-%/.complete: conformance-env/make-env.sh conformance-env/constraints.txt
	bash conformance-env/make-env.sh $* .venv-vllm-$*
	touch $@

vllm-envs: $(VLLM_ENVS)

test: $(VENV)/.installed vllm-envs
	CONTRACT_REQUIRE_VLLM=1 $(VENV)/bin/python -m pytest --hypothesis-profile=ci -n 2

gpu-conformance: $(VENV)/.installed
	bash scripts/gpu-conformance.sh

# Not in CI: the affected-release matrix. Every release from 0.28.0 to 0.34.0 gets its environment
# (the same .venv-vllm-% rule as make test) and a full replay; a release whose environment does not
# build or whose runner the replay does not cover is named and skipped. Then the pages are rewritten
# from the new reports/conformance/.
ALL_VLLM_VERSIONS := 0.28.0 0.29.0 0.30.0 0.31.0 0.32.0 0.33.0 0.34.0

conformance-all: $(VENV)/.installed
	-$(MAKE) -k $(foreach v,$(ALL_VLLM_VERSIONS),.venv-vllm-$(v)/.complete)
	@for v in $(ALL_VLLM_VERSIONS); do \
	  $(VENV)/bin/cudagraph-contract conform --vllm $$v --corpus full; rc=$$?; \
	  [ $$rc -le 1 ] || echo "conformance-all: vLLM $$v not replayed (exit $$rc)"; \
	done
	$(MAKE) verify

clean:
	rm -rf $(VENV) .venv-vllm-* .hypothesis .pytest_cache
