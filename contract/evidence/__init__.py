"""What a vLLM maintainer needs to act on a counterexample: a reproduction, a failing vLLM-style
test, the releases it affects and an honest label of what was run."""
