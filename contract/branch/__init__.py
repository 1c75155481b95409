"""A vLLM source tree under review: which runners it has, the base it is compared with, and the
replay of its own code (``conform --vllm-src``)."""
