"""Conformance replay: the model's traces replayed against an installed real vLLM on CPU.

vLLM's own config normalisation, mode resolution, dispatcher, ``load_model`` wrapping block,
wrapper classes and capture guard run for real; only the CUDA device layer is simulated
(``simcuda``) and the platform object is a CUDA-like stand-in (``platform``). Every module that
touches vLLM imports it lazily, so this package imports without vLLM installed.
"""
