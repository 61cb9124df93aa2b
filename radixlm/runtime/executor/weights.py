"""Build a model from a Hugging Face directory of safetensors files.

The model is built by a `LayerFactory` (`executor/layers/`) whose modules hold their
weights under the checkpoint's names, so the files' state dict loads with no renaming;
modules whose final storage differs take it afterwards in their own post-load step
(`LayerFactory.process_weights_after_loading`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from radixlm.errors import ModelNotFoundError, WeightsMismatchError
from radixlm.runtime.executor.kv_cache_dtype import is_kv_scale_name
from radixlm.runtime.executor.layers import LayerFactory, TorchLayers
from radixlm.runtime.executor.models import get_model_class
from radixlm.runtime.executor.parallel.shards import shard_state
from radixlm.runtime.executor.quant import quant_format

logger = logging.getLogger(__name__)


def build_model(config, layers: LayerFactory) -> nn.Module:
    """The architecture of `config` built of `layers`' modules on the meta device (no
    storage until `load_weights`)."""
    with torch.device("meta"):
        return get_model_class(config)(config, layers)


def load_weights(model: nn.Module, hf_dir: Path, config, dtype: torch.dtype, device) -> nn.Module:
    """Load every *.safetensors in `hf_dir` into `model` (from `build_model`), cast to
    `dtype`, and move it to `device`; returns it in eval mode, before any post-load step.

    A quantized checkpoint (config.json's `quantization_config`) first has its quantized
    modules replaced by their dequantized float32 weights (`executor.quant`; raises
    UnsupportedQuantizationError naming an unsupported scheme); the packed CPU layout keeps
    them quantized (`CheckpointPanels`). The checkpoint's names pass through the family's
    `adapt_checkpoint` (split fused
    tensors, renamed experts); tensors named with a suffix in the family's `fp32_tensors`
    stay float32 (DeepSeek-V3's router). Modules holding a tensor-parallel shard take
    their slice of each tensor (`tp_shards`, `parallel/shards.py`). A tied lm_head (absent
    from the files) shares the embedding. Raises ModelNotFoundError without files,
    WeightsMismatchError naming an unreadable file or every missing, unexpected or wrongly
    shaped tensor.
    """
    state: dict[str, torch.Tensor] = {}
    files = sorted(Path(hf_dir).glob("*.safetensors"))
    if not files:
        raise ModelNotFoundError(f"no *.safetensors files in {hf_dir}")
    for f in files:
        try:
            state.update(load_file(f, device="cpu"))
        except SafetensorError as exc:
            raise WeightsMismatchError(f"{f} is not a readable safetensors file: {exc}") from None
    # KV-cache scales belong to the pool (`kv_cache_dtype.read_kv_scales`), not the model.
    state = {k: v for k, v in state.items() if not is_kv_scale_name(k)}
    reader = quant_format(config)
    if reader is not None:
        state = reader.convert(state)[0]
    family = type(model)
    adapted = family.adapt_checkpoint(state, config)
    _check_no_shadowing(state, adapted, family.checkpoint_name)
    fp32 = family.fp32_tensors
    adapted = shard_state(model, adapted)
    state = {k: v.to(torch.float32 if k.endswith(fp32) else dtype) for k, v in adapted.items()}
    tied = getattr(config, "tie_word_embeddings", False)
    if tied:
        state.pop("lm_head.weight", None)
    check_state(model, state, {"lm_head.weight"} if tied else set(), family.checkpoint_name)
    model.load_state_dict(state, strict=False, assign=True)
    if tied:
        model.tie_weights()
    return model.to(device).eval()


def _check_no_shadowing(original: dict, adapted: dict, source_of) -> None:
    """Raise WeightsMismatchError when the checkpoint holds a tensor under a parameter's
    own name and also the tensor it is mapped from (a split `up_proj` beside the fused
    `gate_up_proj`): one would silently replace the other."""
    both = sorted(
        f"{name} and {src}"
        for name in adapted
        if (src := source_of(name)) != name and name in original and src in original
    )
    if both:
        raise WeightsMismatchError(f"checkpoint holds both {'; '.join(both)}")


def check_state(
    model: nn.Module, state: dict[str, torch.Tensor], skip: set[str], source_of=lambda k: k
) -> None:
    """Raise WeightsMismatchError naming the tensors of `state` that `model` lacks, the
    parameters and buffers `state` lacks (except `skip`), and those of the wrong shape,
    each by its checkpoint name (`source_of(parameter name)`, the family's
    `checkpoint_name`)."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items() if k not in skip}
    missing = sorted({source_of(k) for k in expected if k not in state})
    unexpected = sorted({source_of(k) for k in state if k not in expected})
    wrong = [
        f"{source_of(k)}: checkpoint {tuple(state[k].shape)}, config expects {shape}"
        for k, shape in sorted(expected.items())
        if k in state and tuple(state[k].shape) != shape
    ]
    problems = []
    if missing:
        problems.append(f"missing tensors {missing}")
    if unexpected:
        problems.append(f"unexpected tensors {unexpected}")
    if wrong:
        problems.append(f"wrong shapes [{'; '.join(wrong)}]")
    if problems:
        raise WeightsMismatchError("checkpoint does not match its config: " + ", ".join(problems))


def load_model(
    hf_dir: Path, config, dtype: torch.dtype, device: str, layers: LayerFactory | None = None
) -> nn.Module:
    """Build the architecture of `config` of `layers`' modules (default `TorchLayers`),
    load its weights (`load_weights`) and give every module its final storage."""
    layers = layers or TorchLayers()
    model = load_weights(build_model(config, layers), hf_dir, config, dtype, device)
    layers.process_weights_after_loading(model)
    return model


def weights_bytes(model: nn.Module) -> int:
    """Bytes of the model's unique parameters (a tied head counted once)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total
