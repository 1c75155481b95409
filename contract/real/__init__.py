"""Conformance replay: the model's traces replayed against an installed real vLLM on CPU.

vLLM's own config normalisation, mode resolution, dispatcher, ``load_model`` wrapping block, the
runner's orchestration (on a stand-in runner, ``gpu_model_runner``), wrapper classes, capture guard
and the attention backends' support levels (``attention_backends``) run for real; only the CUDA
device layer is simulated (``simcuda``), the platform object is a CUDA-like stand-in
(``platform``), and ``decisions`` says which decision points were vLLM's. Every module that touches
vLLM imports it lazily, so this package imports without vLLM installed.
"""
