"""The built-in policies: the ``load_model`` wrapping rule of each modelled vLLM revision."""
