"""The LM head's greedy screen: the fp16 GEMM and the candidate selection equal their torch
references, the screened logits give the full head's argmax (ties included) with the
candidates' logits bit for bit, and the engine uses the screen only for argmax-only
batches, with the same tokens as transformers."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from radixlm import Engine
from radixlm.kernels.cpu import pack_panels
from radixlm.runtime.models import head_screen
from radixlm.runtime.models.cpu_linear import PackedHead
from radixlm.runtime.models.head_screen import SCREEN_ROWS, ArgmaxScreen
from tests.runtime.conftest import MODEL, greedy


def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    return before


# Rows: the split-sum tiles (1, 2), the row tiles (3-8) and balanced splits above 8; N: a
# ragged last panel, N < 16 and several panels per thread; K: odd, and not a multiple of 4.
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 9, 13])
@pytest.mark.parametrize("n,k", [(7, 64), (200, 577), (1000, 130)])
@pytest.mark.parametrize("threads", [1, 2])
def test_half_gemm_matches_torch(cpu_kernels, gemm_isa, m, n, k, threads):
    gen = torch.Generator().manual_seed(m * 100 + n + k)
    w16 = torch.randn(n, k, generator=gen).half()
    x = torch.randn(m, k, generator=gen)
    before = _threads(threads)
    try:
        y = cpu_kernels.hmm(x, pack_panels(w16.float()).half(), n)
    finally:
        torch.set_num_threads(before)
    assert y.shape == (m, n) and y.dtype == torch.float32
    torch.testing.assert_close(y, x @ w16.float().t(), rtol=1e-5, atol=1e-4)


def test_half_gemm_rejects_bad_input(cpu_kernels):
    panels = pack_panels(torch.randn(20, 8)).half()
    with pytest.raises(ValueError, match="float16 panels"):
        cpu_kernels.hmm(torch.randn(1, 8), panels.float(), 20)
    with pytest.raises(ValueError, match="do not pack"):
        cpu_kernels.hmm(torch.randn(1, 9), panels, 20)


def _select_reference(approx, coef, norm):
    radius = norm[:, None] * coef[None, :]
    floor = (approx - radius).amax(dim=1)
    return (approx + radius >= floor[:, None]).any(dim=0).nonzero().flatten()


@pytest.mark.parametrize("m", [1, 2, 4])
@pytest.mark.parametrize("v", [8, 1003])
def test_screen_select_matches_torch(cpu_kernels, m, v):
    gen = torch.Generator().manual_seed(m + v)
    approx = torch.randn(m, v, generator=gen) * 4
    coef = torch.rand(v, generator=gen) * 0.05
    norm = torch.rand(m, generator=gen) * 10
    # A tie at the top of row 0 and an entry on the bound of the floor: both kept.
    approx[0, 3] = approx[0, v - 1] = approx[0].max() + 1
    got = cpu_kernels.screen_select(approx, coef, norm)
    want = _select_reference(approx, coef, norm)
    assert torch.equal(got, want)
    assert 3 in got.tolist() and v - 1 in got.tolist()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_screen_select_declines_non_finite_input(cpu_kernels, bad):
    approx, coef, norm = torch.randn(2, 50), torch.full((50,), 0.01), torch.ones(2)
    for i in (7, 49):  # inside the vector loop, and in the tail
        a = approx.clone()
        a[1, i] = bad
        assert cpu_kernels.screen_select(a, coef, norm) is None
    assert cpu_kernels.screen_select(approx, coef, torch.tensor([1.0, bad])) is None
    with pytest.raises(ValueError, match="screen_select"):
        cpu_kernels.screen_select(torch.randn(9, 50), coef, torch.ones(9))


def _head(weight: torch.Tensor, bias: bool = False) -> nn.Linear:
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=bias)
    lin.weight = nn.Parameter(weight, requires_grad=False)
    return lin


#: float16's spacing just above 1.0.
_H = 2.0**-10


def _near_ties(vocab: int = 1000, hidden: int = 64, seed: int = 0) -> torch.Tensor:
    """A head whose rows 10 and 11 are equal (exact ties), rows 20 / 21 differ in one
    weight's last bits (ties to within rounding), and rows 30 / 31 swap order in float16:
    against x = (1, 1, 0, ...) row 30 scores 1 + 0.49 h exactly and 1 in float16 (its
    weight rounds down), row 31 scores 1 + 0.3 h both ways."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(vocab, hidden, generator=gen) * 0.1
    w[11] = w[10]
    w[21] = w[20]
    w[21, 0] = torch.nextafter(w[20, 0], torch.tensor(1.0))
    w[30:32] = 0.0
    w[30, 0] = 1 + 0.49 * _H
    w[31, 0], w[31, 1] = 1.0, 0.3 * _H
    return w


@pytest.mark.parametrize("threads", [1, 2])
def test_argmax_logits_give_the_full_heads_argmax_and_values(cpu_kernels, gemm_isa, threads):
    w = _near_ties()
    head = PackedHead(_head(w), cpu_kernels)
    assert head.attach_screen()
    gen = torch.Generator().manual_seed(1)
    before = _threads(threads)
    try:
        for trial in range(40):
            m = 1 + trial % SCREEN_ROWS
            x = torch.randn(m, w.shape[1], generator=gen)
            if trial % 4 == 1:  # two rows, aimed at the tied pairs: both must stay candidates
                x[0] = w[10] * 5
                x[-1] = w[20] * 5
            if trial % 4 == 2:  # row 30 wins, though its float16 copy scores below row 31
                x[0] = 0.0
                x[0, :2] = 10.0
            full, screened = head.forward(x), head.argmax_logits(x)
            kept = torch.isfinite(screened)
            assert torch.equal(screened.argmax(dim=1), full.argmax(dim=1))
            assert torch.equal(screened[kept], full[kept])  # bit for bit
            assert (screened[~kept] == -math.inf).all()
            assert kept.sum(dim=1).max() < w.shape[0]  # the screen did rule rows out
            if trial % 4 == 1:
                assert kept[0, 10] and kept[0, 11] and kept[-1, 20] and kept[-1, 21]
                assert screened[0].argmax() == 10  # first index of the exact tie
            if trial % 4 == 2:
                approx = cpu_kernels.hmm(x, head.screen.panels, w.shape[0])
                assert approx[0].argmax() == 31 and screened[0].argmax() == 30
    finally:
        torch.set_num_threads(before)


def test_argmax_logits_fall_back_to_the_full_head(cpu_kernels):
    w = _near_ties()
    head = PackedHead(_head(w), cpu_kernels)
    head.attach_screen()
    x = torch.randn(2, w.shape[1])
    x[1, 3] = math.nan
    got, full = head.argmax_logits(x), head.forward(x)
    assert torch.equal(got[0], full[0])  # the whole batch took the full head
    assert torch.isnan(got[1]).all() and torch.isnan(full[1]).all()
    many = torch.randn(SCREEN_ROWS + 1, w.shape[1])
    assert torch.equal(head.argmax_logits(many), head.forward(many))


def test_screen_applies_only_to_fp16_finite_fp32_heads_without_bias(cpu_kernels):
    w = torch.randn(64, 32)
    assert not PackedHead(_head(w, bias=True), cpu_kernels).attach_screen()
    big = w.clone()
    big[3, 4] = 70000.0  # past float16's largest finite value
    assert not ArgmaxScreen.fits(big)
    assert not PackedHead(_head(big), cpu_kernels).attach_screen()
    with pytest.raises(ValueError, match="not finite in float16"):
        ArgmaxScreen(big, cpu_kernels)
    head = PackedHead(_head(w), cpu_kernels)
    panel_bytes = head.extra_bytes
    assert head.attach_screen() and head.screen is not None
    assert head.extra_bytes == panel_bytes + 4 * 32 * 16 * 2 + 64 * 4  # fp16 panels + coef
    x = torch.randn(1, 32)
    assert head.argmax_logits(x).argmax() == head.forward(x).argmax()
    without = PackedHead(_head(w), cpu_kernels)
    assert torch.equal(without.argmax_logits(x), without.forward(x))


def test_bound_covers_the_rounding_error(cpu_kernels):
    """|approximate - exact| stays within ||x|| c_i on every row, for inputs of very
    different scales."""
    w = torch.randn(500, 96) * 0.05
    screen = ArgmaxScreen(w, cpu_kernels)
    exact_panels = pack_panels(w)
    for scale in (1e-3, 1.0, 1e3):
        x = torch.randn(3, 96) * scale
        approx = cpu_kernels.hmm(x, screen.panels, 500)
        exact = cpu_kernels.mm(x, exact_panels, 500)
        bound = x.double().norm(dim=1)[:, None] * screen.coef.double()[None, :]
        assert ((approx.double() - exact.double()).abs() <= bound).all()


class _Counter:
    """Counts ArgmaxScreen.logits calls (monkeypatched in)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        original = head_screen.ArgmaxScreen.logits

        def counted(screen, x, exact):
            self.calls += 1
            return original(screen, x, exact)

        monkeypatch.setattr(head_screen.ArgmaxScreen, "logits", counted)


@pytest.fixture(scope="module")
def fp32_engine():
    with Engine(MODEL, max_total_tokens=4096, weight_format="fp32") as engine:
        yield engine


def test_engine_screens_greedy_batches_with_the_reference_tokens(
    fp32_engine, prompts, reference, monkeypatch
):
    assert fp32_engine.runner.model.lm_head.screen is not None
    count = _Counter(monkeypatch)
    outs = fp32_engine.generate(input_ids=prompts[:3], sampling_params=greedy())
    assert [o["output_ids"] for o in outs] == reference[:3]
    assert count.calls >= 15  # every decode step of 3 rows, and the prefill's last tokens


@pytest.mark.parametrize(
    "params,logprob",
    [
        ({"temperature": 0.7, "seed": 3}, False),
        ({"temperature": 0, "repetition_penalty": 1.3}, False),
        ({"temperature": 0, "logit_bias": {"5": 2.0}}, False),
        ({"temperature": 0, "min_new_tokens": 4}, False),
        ({"temperature": 0}, True),
    ],
)
def test_engine_skips_the_screen_where_logits_are_read(
    fp32_engine, prompts, monkeypatch, params, logprob
):
    count = _Counter(monkeypatch)
    fp32_engine.generate(
        input_ids=prompts[0],
        sampling_params={"max_new_tokens": 4, **params},
        return_logprob=logprob,
    )
    assert count.calls == 0


def test_disabled_screen_keeps_no_copy_and_gives_the_same_tokens(prompts, reference):
    with Engine(
        MODEL, max_total_tokens=4096, weight_format="fp32", disable_lm_head_screen=True
    ) as engine:
        assert engine.runner.model.lm_head.screen is None
        out = engine.generate(input_ids=prompts[0], sampling_params=greedy())
        assert out["output_ids"] == reference[0]
