"""ctypes signatures for the compiled CPU kernels."""

from __future__ import annotations


def bind(fn, argtypes: list, restype=None):
    """Declare a C function's signature for ctypes; returns it."""
    fn.restype = restype
    fn.argtypes = argtypes
    return fn
