"""Model execution: the model runner, KV and request-to-token pools, model classes by
registry (`models/`), weight loading, model-file resolution, CUDA graphs, forward batches."""
