"""Serving benchmark client and workloads (`radixlm bench`). Built in a later issue."""
