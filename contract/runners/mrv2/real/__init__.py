"""The real-code replay of Model Runner V2 (``vllm/v1/worker/gpu/``, vLLM 0.33 and 0.34).

Modules are named after the vLLM files they stand beside: ``model_runner`` runs the blocks of
``v1/worker/gpu/model_runner.py`` that decide modes and capturers, ``cudagraph_utils`` simulates
the names that file binds to CUDA and watches its capture loop, ``backends`` builds the model
whose first forward compiles through vLLM's own ``VllmBackend``. ``replay`` drives a trace.
"""
