"""Output logprobs cover only the tokens the returned text shows: the tokens of a trimmed
stop string and the matched EOS are dropped, streamed or not (formats.py)."""

from __future__ import annotations

from radixlm.frontend.formats import ChatFormat, CompletionFormat
from radixlm.frontend.logprob_format import TokenTexts, clip_to_text
from radixlm.runtime.sampling.logprobs import TokenLogprobs

PIECES = {0: " Paris", 1: ".", 2: "\n", 3: "The", 4: " answer", 5: " is", 9: "<|im_end|>"}


class _Tok:
    all_special_ids = [9]

    def decode(self, ids):
        return "".join(PIECES[i] for i in ids)

    def convert_ids_to_tokens(self, tok):
        return None


TEXTS = TokenTexts(_Tok())


def _lp(ids):
    return TokenLogprobs([-0.5 - i for i in range(len(ids))], list(ids), [[-0.1]] * len(ids),
                         [[i] for i in ids])  # fmt: skip


def test_clip_drops_tokens_after_the_text_and_keeps_a_straddling_one():
    lp = _lp([0, 1, 2, 2, 3, 4, 5])  # " Paris.\n\nThe answer is", stop "answer" trimmed
    text = " Paris.\n\nThe "
    clipped = clip_to_text(TEXTS, lp, 0, len(text))
    assert clipped.token_ids == [0, 1, 2, 2, 3, 4]  # " answer" shows its space
    assert clipped.logprobs == lp.logprobs[:6] and clipped.top_ids == lp.top_ids[:6]
    assert clip_to_text(TEXTS, lp, 0, len(text) - 1).token_ids == [0, 1, 2, 2, 3]
    assert clip_to_text(TEXTS, _lp([0, 9]), 0, 6).token_ids == [0]  # EOS is not shown
    assert clip_to_text(TEXTS, _lp([9]), 0, 0).token_ids == []


def test_chat_full_and_streamed_logprobs_leave_out_eos():
    result = {"text": " Paris.", "finish_reason": "stop", "output_logprobs": _lp([0, 1, 9])}
    full = ChatFormat("c", 0, "m", texts=TEXTS).full_choice(0, result)
    assert [e["token"] for e in full["logprobs"]["content"]] == [" Paris", "."]
    fmt = ChatFormat("c", 0, "m", texts=TEXTS)
    streamed = []
    for text, ids, reason in ((" Paris", [0], None), (".", [1, 9], "stop")):
        chunk = {"text": text, "finish_reason": reason, "output_logprobs": _lp(ids)}
        for body in fmt.deltas(0, chunk, False):
            lp = body["choices"][0]["logprobs"]
            streamed += [e["token"] for e in lp["content"]] if lp else []
    assert streamed == [" Paris", "."]


def test_completion_logprobs_match_the_trimmed_text():
    result = {"text": " Paris.\n\nThe", "finish_reason": "stop",
              "output_logprobs": _lp([0, 1, 2, 2, 3, 4])}  # fmt: skip
    choice = CompletionFormat("c", 0, "m", texts=TEXTS).full_choice(0, result)
    assert "".join(choice["logprobs"]["tokens"]) == choice["text"]
    assert choice["logprobs"]["text_offset"] == [0, 6, 7, 8, 9]
