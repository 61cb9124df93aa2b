"""Random multi-head latent attention cases: `make_case`'s scattered pages and tables over a
fake latent pool, one KV head whose K row is [latent (R) ; rope key (Dr)] and whose V buffer
is a view of each row's first R elements (the contract of the DeepSeek latent pool)."""

from __future__ import annotations

import torch

from radixlm.kernels import ForwardMode
from tests.kernels.cases import Case, make_case


class LatentPool:
    """Per layer `k_buffer[l]` [num_slots, 1, R + Dr] and `v_buffer[l] = k_buffer[l][:, :,
    :R]` (a strided view of the same memory); `set_kv` writes K alone."""

    def __init__(self, k_buffer: list[torch.Tensor], rank: int):
        self.k_buffer = k_buffer
        self.v_buffer = [k[:, :, :rank] for k in k_buffer]
        self.dtype = k_buffer[0].dtype
        self.rank = rank

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_buffer[layer_id].index_copy_(0, loc, k.to(self.dtype))

    def clone(self) -> LatentPool:
        return LatentPool([b.clone() for b in self.k_buffer], self.rank)


class LatentCase(Case):
    def clone_pool(self) -> LatentPool:
        return self.pool.clone()


def make_latent_case(
    mode: ForwardMode,
    prefix_lens: list[int],
    extend_lens: list[int],
    *,
    heads: int,
    rank: int,
    rope_dim: int,
    page_size: int = 1,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
) -> LatentCase:
    """`make_case` with one KV head of Dk = rank + rope_dim over a `LatentPool`: q [T, heads,
    Dk], k [T, 1, Dk], v = k[:, :, :rank]; scaling Dk ** -0.5. Unused slots hold NaN."""
    case = make_case(
        mode, prefix_lens, extend_lens, page_size=page_size, group=heads, kv_heads=1,
        head_dim=rank + rope_dim, dtype=dtype, device=device, seed=seed,
    )  # fmt: skip
    pool = LatentPool(case.pool.k_buffer, rank)
    return LatentCase(pool, case.fb, case.q, case.k, case.k[:, :, :rank], case.scaling)


class SeparatePool(LatentPool):
    """K [num_slots, Hkv, Dk] and a buffer of its own V [num_slots, Hkv, Dv] (Dv != Dk, not
    a view); `set_kv` writes both."""

    def __init__(self, k_buffer: list[torch.Tensor], v_buffer: list[torch.Tensor]):
        self.k_buffer, self.v_buffer = k_buffer, v_buffer
        self.dtype = k_buffer[0].dtype

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_buffer[layer_id].index_copy_(0, loc, k.to(self.dtype))
        self.v_buffer[layer_id].index_copy_(0, loc, v.to(self.dtype))

    def clone(self) -> SeparatePool:
        return SeparatePool([b.clone() for b in self.k_buffer], [b.clone() for b in self.v_buffer])


def separate_values(case: LatentCase, seed: int = 1) -> LatentCase:
    """The case with V in a buffer of its own: random values of the latent's width where K
    has a value (the padding page stays zero, unused slots NaN), and random new V."""
    gen = torch.Generator().manual_seed(seed)
    k = case.pool.k_buffer[0]
    v = case.pool.v_buffer[0].clone()
    finite = torch.isfinite(v)
    v[finite] = torch.randn(int(finite.sum()), generator=gen).to(v.dtype)
    v[~finite.any(-1).any(-1)] = float("nan")
    v[(k == 0).all(-1).all(-1)] = 0
    new_v = torch.randn(case.v.shape, generator=gen).to(case.v.dtype)
    pool = SeparatePool([k], [v])
    return LatentCase(pool, case.fb, case.q, case.k, new_v, case.scaling)
