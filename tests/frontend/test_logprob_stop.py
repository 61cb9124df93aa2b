"""Output logprobs list every generated token, streamed or not: the tokens of a trimmed
stop string (the one that completed the match included) and a matched EOS keep their
entries, so the entries and usage.completion_tokens count the same tokens (formats.py)."""

from __future__ import annotations

from radixlm.frontend.formats import ChatFormat, CompletionFormat
from radixlm.frontend.logprob_format import TokenTexts
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


def test_chat_full_and_streamed_logprobs_keep_the_eos_entry():
    result = {"text": " Paris.", "finish_reason": "stop", "output_logprobs": _lp([0, 1, 9])}
    full = ChatFormat("c", 0, "m", texts=TEXTS).full_choice(0, result)
    assert [e["token"] for e in full["logprobs"]["content"]] == [" Paris", ".", "<|im_end|>"]
    assert full["message"]["content"] == " Paris."
    fmt = ChatFormat("c", 0, "m", texts=TEXTS)
    streamed = []
    for text, ids, reason in ((" Paris", [0], None), (".", [1, 9], "stop")):
        chunk = {"text": text, "finish_reason": reason, "output_logprobs": _lp(ids)}
        for body in fmt.deltas(0, chunk, False):
            lp = body["choices"][0]["logprobs"]
            streamed += [e["token"] for e in lp["content"]] if lp else []
    assert streamed == [" Paris", ".", "<|im_end|>"]


def test_completion_logprobs_keep_the_stop_string_tokens():
    # " Paris.\n\nThe answer" with stop "\n\nThe": the text ends before it, the entries
    # go on to the token that completed the match ("The").
    result = {"text": " Paris.", "finish_reason": "stop", "output_logprobs": _lp([0, 1, 2, 2, 3])}
    choice = CompletionFormat("c", 0, "m", texts=TEXTS).full_choice(0, result)
    assert choice["text"] == " Paris."
    assert choice["logprobs"]["tokens"] == [" Paris", ".", "\n", "\n", "The"]
    assert choice["logprobs"]["text_offset"] == [0, 6, 7, 8, 9]
    fmt = CompletionFormat("c", 0, "m", texts=TEXTS)
    streamed = []
    for text, ids, reason in ((" Paris.", [0, 1, 2], None), ("", [2, 3], "stop")):
        chunk = {"text": text, "finish_reason": reason, "output_logprobs": _lp(ids)}
        for body in fmt.deltas(0, chunk, False):
            streamed += body["choices"][0]["logprobs"]["tokens"]
    assert streamed == choice["logprobs"]["tokens"]
