"""A Mixtral checkpoint that does not match its config fails at load naming the tensors
as the checkpoint names them (`block_sparse_moe.experts.{e}.w1/w2/w3`), also when it holds
an expert twice under both namings."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixlm import Engine
from radixlm.errors import WeightsMismatchError
from tests.tiny_models import save_family_model

P = "model.layers.1.block_sparse_moe"

CASES = {
    "missing-expert-weight": (
        lambda s: s.pop(f"{P}.experts.3.w1.weight"),
        f"missing tensors ['{P}.experts.3.w1.weight']",
    ),
    "extra-expert": (
        lambda s: s.update({f"{P}.experts.4.w2.weight": torch.zeros(64, 48)}),
        f"unexpected tensors ['{P}.experts.4.w2.weight']",
    ),
    "wrong-shape": (
        lambda s: s.update({f"{P}.experts.2.w2.weight": torch.zeros(48, 64)}),
        f"{P}.experts.2.w2.weight: checkpoint (48, 64), config expects (64, 48)",
    ),
    "both-namings": (
        lambda s: s.update({"model.layers.1.mlp.experts.0.up_proj.weight": torch.zeros(48, 64)}),
        f"checkpoint holds both model.layers.1.mlp.experts.0.up_proj.weight and "
        f"{P}.experts.0.w3.weight",
    ),
}


@pytest.fixture(scope="module")
def mixtral_dir(tmp_path_factory, hf_dir):
    path = tmp_path_factory.mktemp("mixtral")
    save_family_model("mixtral", path, hf_dir)
    return path


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_mixtral_checkpoint_names_the_tensor(case, mixtral_dir, tmp_path):
    edit, message = CASES[case]
    ckpt = tmp_path / "model"
    shutil.copytree(mixtral_dir, ckpt)
    (f,) = ckpt.glob("*.safetensors")
    state = load_file(f)
    edit(state)
    save_file(state, f, metadata={"format": "pt"})
    with pytest.raises(WeightsMismatchError) as err:
        Engine(str(ckpt), max_total_tokens=256)
    assert message in str(err.value)
