"""A model directory radixlm cannot load fails at start with a typed error naming the file
or field: no tokenizer files, an unreadable config.json, a truncated or absent weights
file, MoE settings outside what the block runs."""

from __future__ import annotations

import json
import shutil

import pytest

from radixlm import Engine
from radixlm.errors import ModelNotFoundError, UnsupportedModelError, WeightsMismatchError
from tests.tiny_models import save_family_model


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory, hf_dir):
    path = tmp_path_factory.mktemp("llama")
    save_family_model("llama", path, hf_dir)
    return path


def _copy(src, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(src, dst)
    return dst


def test_no_tokenizer_files(llama_dir, tmp_path):
    ckpt = _copy(llama_dir, tmp_path)
    for f in ckpt.glob("tokenizer*"):
        f.unlink()
    with pytest.raises(ModelNotFoundError, match="has no tokenizer: none of tokenizer.json"):
        Engine(str(ckpt), max_total_tokens=256)


def test_config_that_is_not_json(llama_dir, tmp_path):
    ckpt = _copy(llama_dir, tmp_path)
    (ckpt / "config.json").write_text('{"architectures": [LlamaForCausalLM]}')
    with pytest.raises(UnsupportedModelError, match=r"cannot read .*config\.json"):
        Engine(str(ckpt), max_total_tokens=256)


def test_truncated_weights_file(llama_dir, tmp_path):
    ckpt = _copy(llama_dir, tmp_path)
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(WeightsMismatchError, match="model.safetensors is not a readable"):
        Engine(str(ckpt), max_total_tokens=256)


def test_no_weights_file(llama_dir, tmp_path):
    ckpt = _copy(llama_dir, tmp_path)
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(ModelNotFoundError, match=r"no \*\.safetensors files"):
        Engine(str(ckpt), max_total_tokens=256)


def test_moe_top_k_beyond_the_experts_names_the_fields(tmp_path, hf_dir):
    save_family_model("mixtral", tmp_path, hf_dir)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_experts_per_tok": 9}))
    with pytest.raises(UnsupportedModelError, match="num_experts_per_tok.*top_k must be in"):
        Engine(str(tmp_path), max_total_tokens=256)
