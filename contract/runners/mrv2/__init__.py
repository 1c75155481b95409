"""Model Runner V2 (``v1/worker/gpu/``), modelled per release: its own manager, runner and
speculator modules, named after the vLLM files they mirror. MRV1 lives in ``contract.runners.mrv1.model.gpu_model_runner``."""
