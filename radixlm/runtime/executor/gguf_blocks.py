"""Read a GGUF file's quantized projection weights as raw blocks, under Hugging Face names,
for the CPU layout that keeps them quantized (`layers.cpu_linear.GgufPanels`).

Reading the file with the `gguf` package takes seconds (it parses the whole vocabulary), so
the blocks are cached beside the fp32 conversion (`BLOCKS_FILE` under the converted
directory, a safetensors file of uint8 tensors) and later loads map that file.

Only the block types the CPU kernels read (`kernels.cpu.quant.FORMATS`: Q4_1, Q8_0) are
returned; every other tensor (norms, F32/F16 weights, other block types such as the
Q4_K / Q5_0 / Q6_K of a Q4_K_M file) comes from the fp32 safetensors conversion as before,
and the projections left fp32 for their block type are named in a warning (once, when the
blocks are read and cached). For `llama` files, llama.cpp's converter permuted the q and k
rows (RoPE halves interleaved per head); the rows are put back in the Hugging Face order
here, as transformers does when it dequantizes the file.
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from radixlm.kernels.cpu.quant import FORMATS

logger = logging.getLogger(__name__)

#: GGUF tensor name (after "blk.N.") -> Hugging Face module name (after "model.layers.N.").
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.weight")
#: The cache of a converted GGUF's blocks, in a subdirectory of its converted directory
#: (whose own *.safetensors are the fp32 weights).
BLOCKS_FILE = "gguf_blocks/blocks.safetensors"


class RawBlocks(NamedTuple):
    """One weight W [N, K] as GGUF blocks: `fmt` a `quant` format code, `data` uint8
    [N, K / 32 * block bytes] with rows in the Hugging Face order."""

    fmt: int
    data: torch.Tensor
    k: int


def _unpermute_rows(data: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation: its rows [heads, half, 2] of each head (RoPE
    pairs interleaved) came from the HF rows [heads, 2, half] (rotate-half)."""
    n = data.shape[0]
    half = n // heads // 2
    return data.reshape(heads, half, 2, -1).transpose(1, 2).reshape(n, -1)


def load_blocks(gguf: Path, hf_dir: Path, config) -> dict[str, RawBlocks]:
    """The quantized projection weights of `gguf`, keyed by Hugging Face module name
    (e.g. "model.layers.0.self_attn.q_proj", "lm_head"; a tied head maps to the token
    embedding's blocks): from `hf_dir / BLOCKS_FILE`, written there from the file on first
    use. `config` is the model's transformers config (head counts, tying). Raises
    ValueError when the file cannot be read as GGUF."""
    from safetensors.torch import load_file, save_file

    cached = Path(hf_dir) / BLOCKS_FILE
    if cached.is_file():
        from safetensors import safe_open

        with safe_open(str(cached), "pt") as f:
            meta = f.metadata() or {}
        tensors = load_file(str(cached))
        blocks = {}
        for name, data in tensors.items():
            fmt, k = map(int, meta[name].split(","))
            blocks[name] = RawBlocks(fmt, data, k)
    else:
        blocks = read_blocks(gguf, config)
        cached.parent.mkdir(exist_ok=True)
        tmp = cached.with_name(f"{cached.name}.tmp{os.getpid()}")
        meta = {name: f"{b.fmt},{b.k}" for name, b in blocks.items()}
        save_file({name: b.data for name, b in blocks.items()}, str(tmp), metadata=meta)
        os.replace(tmp, cached)  # atomic: concurrent writers race harmlessly
    if "lm_head" not in blocks and getattr(config, "tie_word_embeddings", False):
        if "model.embed_tokens" in blocks:
            blocks["lm_head"] = blocks["model.embed_tokens"]
    return blocks


def read_blocks(gguf: Path, config) -> dict[str, RawBlocks]:
    """Read the quantized projection weights of `gguf` (as `load_blocks`, without the tied
    head's alias and without the cache). Raises ValueError when the file cannot be read."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf))
    arch_field = reader.fields.get("general.architecture")
    arch = bytes(arch_field.parts[-1]).decode() if arch_field else ""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    out: dict[str, RawBlocks] = {}
    unread: Counter[str] = Counter()  # projections in block types the kernels do not read
    for tensor in reader.tensors:
        if tensor.name == "token_embd.weight":
            name = "model.embed_tokens"
        elif tensor.name == "output.weight":
            name = "lm_head"
        elif (m := _LAYER.fullmatch(tensor.name)) and m.group(2) in _LAYER_NAMES:
            name = f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
        else:
            continue
        fmt = FORMATS.get(tensor.tensor_type.name)
        if fmt is None:
            if tensor.tensor_type.name not in ("F32", "F16", "BF16"):
                unread[tensor.tensor_type.name] += 1
            continue
        data = torch.from_numpy(np.array(tensor.data, dtype=np.uint8))
        if arch == "llama" and tensor.name.endswith(("attn_q.weight", "attn_k.weight")):
            data = _unpermute_rows(data, heads if "attn_q" in tensor.name else kv_heads)
        out[name] = RawBlocks(fmt, data.contiguous(), int(tensor.shape[0]))  # GGUF: [K, N]
    logger.info("%s: %d quantized projection weights read as blocks", gguf.name, len(out))
    if unread:
        logger.warning(
            "%s: projection weights in block types radixlm's CPU kernels do not read (%s) "
            "stay fp32 panels; kept as blocks: %s",
            gguf.name,
            ", ".join(f"{n} x{c}" for n, c in sorted(unread.items())),
            ", ".join(sorted(FORMATS)),
        )
    return out
