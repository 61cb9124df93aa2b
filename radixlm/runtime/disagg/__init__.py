"""Prefill/decode disaggregation: KV transfer between a prefill and a decode server."""
