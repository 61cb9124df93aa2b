"""The LM head's greedy screen: the fp16 and bfloat16 GEMMs and the candidate selection
equal their torch references, the error bound holds, the screened logits give the full
head's argmax (ties included) with its largest logit bit for bit, and the engine uses the
screen only for argmax-only batches, with the same tokens as transformers."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from radixlm import Engine
from radixlm.kernels.cpu import pack_pair_panels, pack_panels
from radixlm.runtime.executor.layers import head_screen
from radixlm.runtime.executor.layers.cpu_linear import PackedHead
from radixlm.runtime.executor.layers.head_screen import ArgmaxScreen, Bf16Product, Fp16Product
from tests.runtime.conftest import MODEL, greedy


def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    return before


def _need_bf16(kernels):
    if not kernels.has_bf16:
        pytest.skip("the CPU lacks AVX-512 BF16")


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


def test_pack_pair_panels_layout():
    w = torch.arange(20 * 3, dtype=torch.float32).view(20, 3).to(torch.bfloat16)
    p = pack_pair_panels(w)
    assert p.shape == (2, 2, 16, 2)
    assert torch.equal(p[0, 0, :, 0], w[:16, 0]) and torch.equal(p[0, 0, :, 1], w[:16, 1])
    assert torch.equal(p[1, 1, :4, 0], w[16:, 2])
    assert not p[1, 1, :, 1].any() and not p[1, :, 4:].any()  # zero padding in K and N


# Rows: 1-2 (two partial sums), tiles of up to 8, balanced splits to 16; N: an odd panel
# count (the last pair is one panel), a ragged last panel, N < 16.
@pytest.mark.parametrize("m", [1, 2, 3, 8, 9, 16])
@pytest.mark.parametrize("n,k", [(7, 64), (200, 578), (1000, 130)])
@pytest.mark.parametrize("threads", [1, 2])
def test_bf16_gemm_matches_torch(cpu_kernels, m, n, k, threads):
    _need_bf16(cpu_kernels)
    gen = torch.Generator().manual_seed(m * 100 + n + k)
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    before = _threads(threads)
    try:
        y = cpu_kernels.bmm(x, pack_pair_panels(w), n)
    finally:
        torch.set_num_threads(before)
    assert y.shape == (m, n) and y.dtype == torch.float32
    torch.testing.assert_close(y, x.float() @ w.float().t(), rtol=1e-5, atol=1e-4)


def test_16_bit_gemms_reject_bad_input(cpu_kernels):
    panels = pack_panels(torch.randn(20, 8)).half()
    with pytest.raises(ValueError, match="float16 panels"):
        cpu_kernels.hmm(torch.randn(1, 8), panels.float(), 20)
    with pytest.raises(ValueError, match="do not pack"):
        cpu_kernels.hmm(torch.randn(1, 9), panels, 20)
    pairs = pack_pair_panels(torch.randn(20, 8).to(torch.bfloat16))
    with pytest.raises(ValueError, match="bfloat16"):
        cpu_kernels.bmm(torch.randn(1, 8), pairs, 20)
    with pytest.raises(ValueError, match="in pairs"):
        cpu_kernels.bmm(torch.randn(1, 10).to(torch.bfloat16), pairs, 20)


def _select_reference(approx, c1, c2, n1, n2, pad):
    radius = (n1[:, None] * c1[None, :] + n2[:, None] * c2[None, :]) + pad
    floor = (approx - radius).amax(dim=1)
    return (approx + radius >= floor[:, None]).any(dim=0).nonzero().flatten()


@pytest.mark.parametrize("m", [1, 2, 5, 16])
@pytest.mark.parametrize("v", [8, 1003])
@pytest.mark.parametrize("threads", [1, 2])
def test_screen_select_matches_torch(cpu_kernels, m, v, threads):
    gen = torch.Generator().manual_seed(m + v)
    approx = torch.randn(m, v, generator=gen) * 4
    c1, c2 = torch.rand(v, generator=gen) * 0.05, torch.rand(v, generator=gen) * 0.02
    n1, n2 = torch.rand(m, generator=gen) * 10, torch.rand(m, generator=gen)
    # A tie at the top of row 0, in the vector loop and in the tail: both kept.
    approx[0, 3] = approx[0, v - 1] = approx[0].max() + 1
    before = _threads(threads)
    try:
        got = cpu_kernels.screen_select(approx, c1, c2, n1, n2, 2.0**-100)
    finally:
        torch.set_num_threads(before)
    want = _select_reference(approx, c1, c2, n1, n2, 2.0**-100)
    assert torch.equal(got, want)
    assert 3 in got.tolist() and v - 1 in got.tolist()
    # With zero radii only the ties are left.
    zero = torch.zeros(v)
    only = cpu_kernels.screen_select(approx[:1], zero, zero, n1[:1], n2[:1], 0.0)
    assert only.tolist() == [3, v - 1]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_screen_select_declines_non_finite_input(cpu_kernels, bad):
    approx, c = torch.randn(2, 50), torch.full((50,), 0.01)
    ones = torch.ones(2)
    for i in (7, 49):  # inside the vector loop, and in the tail
        a = approx.clone()
        a[1, i] = bad
        assert cpu_kernels.screen_select(a, c, c, ones, ones, 0.0) is None
    assert cpu_kernels.screen_select(approx, c, c, torch.tensor([1.0, bad]), ones, 0.0) is None
    assert cpu_kernels.screen_select(approx, c, c, ones, torch.tensor([bad, 1.0]), 0.0) is None
    with pytest.raises(ValueError, match="screen_select"):
        cpu_kernels.screen_select(torch.randn(17, 50), c, c, torch.ones(17), torch.ones(17), 0.0)


@pytest.fixture(params=["fp16", "bf16"])
def screen_form(request, cpu_kernels, monkeypatch):
    """Runs the test with each form of the screen's copy this CPU has."""
    if request.param == "bf16":
        _need_bf16(cpu_kernels)
    form = Bf16Product if request.param == "bf16" else Fp16Product
    monkeypatch.setattr(ArgmaxScreen, "product_for", staticmethod(lambda kernels: form(kernels)))
    return form


def _head(weight: torch.Tensor, bias: bool = False) -> nn.Linear:
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=bias)
    lin.weight = nn.Parameter(weight, requires_grad=False)
    return lin


def _packed_head(lin: nn.Linear, kernels) -> PackedHead:
    """A loaded `PackedHead` holding `lin`'s weight and bias (no screen attached yet)."""
    head = PackedHead(lin.in_features, lin.out_features, lin.bias is not None, kernels)
    head.weight, head.bias = lin.weight, lin.bias
    head.process_weights_after_loading()
    return head


#: float16's spacing just above 1.0, and bfloat16's.
_H16, _HB = 2.0**-10, 2.0**-7


def _near_ties(vocab: int = 1000, hidden: int = 64, seed: int = 0) -> torch.Tensor:
    """A head whose rows 10 and 11 are equal (exact ties), rows 20 / 21 differ in one
    weight's last bits (ties to within rounding), and rows 30 / 31 swap order in 16 bits:
    against x = (1, 1, 0, ...) row 30 scores 1 + 0.49 h exactly and 1 in fp16 and
    bfloat16 (its weight rounds down), row 31 scores 1 + 0.3 h both ways (h = bfloat16's
    spacing at 1; float16's is finer, so for it rows 32 / 33 do the same with its own)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(vocab, hidden, generator=gen) * 0.1
    w[11] = w[10]
    w[21] = w[20]
    w[21, 0] = torch.nextafter(w[20, 0], torch.tensor(1.0))
    w[30:34] = 0.0
    w[30, 0], w[32, 2] = 1 + 0.49 * _HB, 1 + 0.49 * _H16
    w[31, 0], w[31, 1] = 1.0, 0.3 * _HB
    w[33, 2], w[33, 3] = 1.0, 0.3 * _H16
    return w


class _Selected:
    """Records how many candidates each screen_select call kept."""

    def __init__(self, kernels, monkeypatch):
        self.counts: list[int] = []
        original = type(kernels).screen_select

        def counted(k, *args):
            ids = original(k, *args)
            self.counts.append(-1 if ids is None else ids.numel())
            return ids

        monkeypatch.setattr(type(kernels), "screen_select", counted)


@pytest.mark.parametrize("threads", [1, 2])
def test_argmax_logits_give_the_full_heads_argmax(
    cpu_kernels, gemm_isa, screen_form, threads, monkeypatch
):
    w = _near_ties()
    head = _packed_head(_head(w), cpu_kernels)
    assert head.attach_screen() and isinstance(head.screen.product, screen_form)
    picked = _Selected(cpu_kernels, monkeypatch)
    # The pair whose order the copy swaps, and the inputs that score it.
    pair, swap = ((31, 30), [0, 1]) if screen_form is Bf16Product else ((33, 32), [2, 3])
    gen = torch.Generator().manual_seed(1)
    before = _threads(threads)
    try:
        for trial in range(48):
            m = 1 + trial % head.screen.rows
            x = torch.randn(m, w.shape[1], generator=gen)
            if trial % 4 == 1 and m > 1:  # aimed at the tied pairs: both stay candidates
                x[0] = w[10] * 5
                x[-1] = w[20] * 5
            if trial % 4 == 2:  # row 30 (32) wins, though its copy scores below row 31 (33)
                x[0] = 0.0
                x[0, swap] = 10.0
            full, screened = head.forward(x), head.argmax_logits(x)
            assert torch.equal(screened.argmax(dim=1), full.argmax(dim=1))
            assert torch.equal(screened.amax(dim=1), full.amax(dim=1))  # bit for bit
            if trial % 4 == 1 and m > 1:
                assert screened[0].argmax() == 10  # first index of the exact tie
            if trial % 4 == 2:
                xs = head.screen.product.approximate(x, head.screen.panels, w.shape[0])[0]
                assert xs[0].argmax() == pair[0]  # the copy alone would pick wrong
                assert screened[0].argmax() == full[0].argmax() == pair[1]
    finally:
        torch.set_num_threads(before)
    assert picked.counts and -1 not in picked.counts
    assert max(picked.counts) < w.shape[0] // 10  # the screen did rule most rows out


def test_argmax_logits_fall_back_to_the_full_head(cpu_kernels, screen_form):
    w = _near_ties()
    head = _packed_head(_head(w), cpu_kernels)
    head.attach_screen()
    x = torch.randn(2, w.shape[1])
    x[1, 3] = math.nan
    got, full = head.argmax_logits(x), head.forward(x)
    assert torch.equal(got[0], full[0])  # the whole batch took the full head
    assert torch.isnan(got[1]).all() and torch.isnan(full[1]).all()
    many = torch.randn(head.screen.rows + 1, w.shape[1])
    assert torch.equal(head.argmax_logits(many), head.forward(many))


def test_screen_applies_only_to_finite_fp32_heads_without_bias(cpu_kernels, screen_form):
    w = torch.randn(64, 32)
    assert not _packed_head(_head(w, bias=True), cpu_kernels).attach_screen()
    big = w.clone()
    big[3, 4] = 3.4e38 if screen_form is Bf16Product else 70000.0  # past the copy's range
    assert not ArgmaxScreen.fits(big, cpu_kernels)
    assert not _packed_head(_head(big), cpu_kernels).attach_screen()
    with pytest.raises(ValueError, match="not finite in"):
        ArgmaxScreen(big, cpu_kernels)
    head = _packed_head(_head(w), cpu_kernels)
    panel_bytes = head.extra_bytes
    assert head.attach_screen() and head.screen is not None
    assert head.extra_bytes == panel_bytes + 4 * 32 * 16 * 2 + 2 * 64 * 4  # copy + c1, c2
    x = torch.randn(1, 32)
    assert head.argmax_logits(x).argmax() == head.forward(x).argmax()
    without = _packed_head(_head(w), cpu_kernels)
    assert torch.equal(without.argmax_logits(x), without.forward(x))


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_bound_covers_the_error(cpu_kernels, screen_form, scale):
    """|approximate - exact| <= n1 c1 + n2 c2 + pad on every row, for inputs of very
    different scales, with entries the product reads as zero (below 2^-40) and subnormal
    weights."""
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(500, 96, generator=gen) * 0.05
    w[7, :10] = 1e-39  # subnormal in fp32
    screen = ArgmaxScreen(w, cpu_kernels)
    exact_panels = pack_panels(w)
    x = torch.randn(3, 96, generator=gen) * scale
    x[1, :20] = 1e-13  # below 2^-40
    approx, xs = screen.product.approximate(x, screen.panels, 500)
    exact = cpu_kernels.mm(x, exact_panels, 500)
    n1 = xs.double().norm(dim=1)
    n2 = (x.double() - xs.double()).norm(dim=1)
    assert n2[1] > 0
    bound = n1[:, None] * screen.c1.double() + n2[:, None] * screen.c2.double() + 2.0**-100
    assert ((approx.double() - exact.double()).abs() <= bound).all()


def _overflowing_heads():
    """(form, W, x) whose exact head overflows in one partial sum (the full head's argmax
    is that row's +inf) while the copy's product, summed in another order, stays finite.
    62 more rows of small weights make the vocabulary large enough for the screen to keep
    its candidates (at most an eighth of it)."""
    a = 2.0**127
    bf16 = torch.full((64, 4), 0.01)
    bf16[:2] = torch.tensor([[0.0, a, a, -a], [a, 2.0**126, 0.0, 0.0]])
    fp16 = torch.full((64, 8), 0.01)
    fp16[:2] = 0.0
    fp16[0, :4], fp16[0, 4:], fp16[1, 0] = 65504.0, -65504.0, 1.0
    return [
        (Bf16Product, bf16, torch.ones(1, 4)),
        (Fp16Product, fp16, torch.full((1, 8), 3e33)),
    ]


@pytest.mark.parametrize("case", [0, 1])
def test_overflowing_sums_take_the_full_head(cpu_kernels, monkeypatch, case):
    form, w, x = _overflowing_heads()[case]
    if form is Bf16Product:
        _need_bf16(cpu_kernels)
    monkeypatch.setattr(ArgmaxScreen, "product_for", staticmethod(lambda kernels: form(kernels)))
    head = _packed_head(_head(w), cpu_kernels)
    assert head.attach_screen()
    full = head.forward(x)
    assert full[0, 0] == math.inf
    assert torch.equal(head.argmax_logits(x), full)


def test_rows_with_a_norm_beyond_float32_get_no_screen(cpu_kernels, screen_form):
    w = torch.zeros(2, 16)
    w[1, :2] = 1.0
    if screen_form is Bf16Product:
        w[0, 2:9] = 2.0**127  # each finite in bfloat16, their norm is not in fp32
    else:
        pytest.skip("fp16 rows cannot reach float32's largest norm")
    assert ArgmaxScreen.fits(w, cpu_kernels)
    with pytest.raises(ValueError, match="row norm"):
        ArgmaxScreen(w, cpu_kernels)
    assert not _packed_head(_head(w), cpu_kernels).attach_screen()


def test_too_many_candidates_take_the_full_head(cpu_kernels, screen_form, monkeypatch):
    w = torch.randn(160, 32)
    head = _packed_head(_head(w), cpu_kernels)
    head.attach_screen()
    picked = _Selected(cpu_kernels, monkeypatch)
    x = torch.zeros(1, 32)  # every logit 0: every row a candidate
    assert torch.equal(head.argmax_logits(x), head.forward(x))
    assert picked.counts == [160]


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


def test_engine_without_the_screen_keeps_no_copy_and_gives_the_same_tokens(prompts, reference):
    with Engine(
        MODEL, max_total_tokens=4096, weight_format="fp32", disable_lm_head_screen=True
    ) as engine:
        assert engine.runner.model.lm_head.screen is None
        out = engine.generate(input_ids=prompts[0], sampling_params=greedy())
        assert out["output_ids"] == reference[0]


@pytest.mark.parametrize("topk", [1, 2])
def test_engine_screens_greedy_verify_steps(fp32_engine, prompts, reference, monkeypatch, topk):
    """n-gram verify steps (a chain, or a tree: 4 rows per request) take the screen and
    accept exactly the reference tokens; two requests where the screen takes 8 rows or
    more (bfloat16 form), one where it takes 4 (fp16 form)."""
    import dataclasses

    from radixlm.runtime.sched.decode import NormalDecode
    from radixlm.runtime.speculative import make_speculative_decode

    sched = fp32_engine.scheduler
    args = dataclasses.replace(
        fp32_engine.args, speculative_algorithm="ngram", speculative_budget="fixed",
        speculative_topk=topk, speculative_num_draft_tokens=3,
    )  # fmt: skip
    sched.decoder = make_speculative_decode(args, fp32_engine.runner)
    n = 2 if fp32_engine.runner.model.lm_head.screen.rows >= 8 else 1
    rows: list[int] = []
    original = head_screen.ArgmaxScreen.logits

    def counted(screen, x, exact):
        rows.append(x.shape[0])
        return original(screen, x, exact)

    monkeypatch.setattr(head_screen.ArgmaxScreen, "logits", counted)
    try:
        outs = fp32_engine.generate(input_ids=prompts[:n], sampling_params=greedy())
        verifies = sched.decoder.counters.verify_steps
    finally:
        sched.decoder = NormalDecode()
    assert [o["output_ids"] for o in outs] == reference[:n]
    assert verifies > 0
    assert max(rows) > n  # verify steps: more rows than requests
