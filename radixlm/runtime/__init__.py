"""Processes and the engine: scheduler, model runner, memory pools, sampling, models."""
