# The two entry points: `make verify` (verify the built-in policies, write reports/) and
# `make test` (the test suite, real-vLLM conformance included). Both start from nothing.
PYTHON ?= python3
VENV := .venv
VLLM_VERSIONS := 0.29.0 0.30.0
VLLM_ENVS := $(foreach v,$(VLLM_VERSIONS),.venv-vllm-$(v)/.complete)

.PHONY: verify test vllm-envs gpu-conformance gpu-rehearsal clean

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

# The GPU run rehearsed on this CPU machine: Python 3.12, torch 2.11.0, the GPU machine's packages,
# the bundle as carried, NVML and triton emulated (scripts/gpu-rehearsal.sh, reports/gpu/README.md).
gpu-rehearsal: .venv-vllm-0.30.0/.complete
	bash scripts/gpu-rehearsal.sh

clean:
	rm -rf $(VENV) .venv-vllm-* .hypothesis .pytest_cache
