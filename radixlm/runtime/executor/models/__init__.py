"""Model architectures by the `architectures` name in a Hugging Face config."""

from __future__ import annotations

from torch import nn

from radixlm.errors import UnsupportedModelError
from radixlm.runtime.executor.models.llama import LlamaForCausalLM, Qwen2ForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
}


def get_model_class(config) -> type[nn.Module]:
    """Class implementing `config.architectures[0]`. Raises UnsupportedModelError."""
    for arch in getattr(config, "architectures", None) or []:
        if arch in MODEL_REGISTRY:
            return MODEL_REGISTRY[arch]
    raise UnsupportedModelError(
        f"unsupported architecture {getattr(config, 'architectures', None)}; "
        f"supported: {sorted(MODEL_REGISTRY)}"
    )
