"""Processes around the scheduler: tokenizer manager (HTTP side), scheduler and detokenizer
processes, their launch, ZMQ IPC and msgspec messages, and the serving stack's construction."""
