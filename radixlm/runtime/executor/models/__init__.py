"""Model architectures by the `architectures` name in a Hugging Face config.

One module per family; adding a family is a new module plus its entries here.
"""

from __future__ import annotations

from radixlm.errors import UnsupportedModelError
from radixlm.runtime.executor.models.decoder import CausalLM
from radixlm.runtime.executor.models.deepseek import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM
from radixlm.runtime.executor.models.gemma3 import Gemma3ForCausalLM
from radixlm.runtime.executor.models.llama import (
    LlamaForCausalLM,
    MistralForCausalLM,
    Qwen2ForCausalLM,
)
from radixlm.runtime.executor.models.mixtral import MixtralForCausalLM
from radixlm.runtime.executor.models.phi3 import Phi3ForCausalLM
from radixlm.runtime.executor.models.qwen3 import Qwen3ForCausalLM
from radixlm.runtime.executor.models.qwen_moe import Qwen2MoeForCausalLM, Qwen3MoeForCausalLM

#: config.architectures[i] -> the class implementing it.
MODEL_REGISTRY: dict[str, type[CausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
    "Phi3ForCausalLM": Phi3ForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "Qwen2MoeForCausalLM": Qwen2MoeForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "DeepseekV2ForCausalLM": DeepseekV2ForCausalLM,
    "DeepseekV3ForCausalLM": DeepseekV3ForCausalLM,  # also Kimi-K2's configs
}


def get_model_class(config) -> type[CausalLM]:
    """Class implementing `config.architectures`. Raises UnsupportedModelError listing
    the supported architectures."""
    for arch in getattr(config, "architectures", None) or []:
        if arch in MODEL_REGISTRY:
            return MODEL_REGISTRY[arch]
    raise UnsupportedModelError(
        f"unsupported architecture {getattr(config, 'architectures', None)}; "
        f"supported: {sorted(MODEL_REGISTRY)}"
    )
