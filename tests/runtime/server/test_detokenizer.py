"""Incremental detokenization never splits a UTF-8 character and never repeats text."""

from __future__ import annotations

import pytest

from radixlm.runtime.server.detokenizer import IncrementalDetokenizer, RequestDetokenizer

TEXTS = [
    "Hello, world! Plain ASCII text.",
    "Ünïcödé: naïve café, 東京タワー, 🚀🎉 and 👩‍💻 emoji.",
    "Mixed\nlines\twith  spaces and émojis 😀😀😀",
]


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_concatenate_to_decode(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.add([i]) for i in ids] + [detok.flush()]
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert all("\ufffd" not in d for d in deltas)


def test_partial_character_is_held_back(tokenizer):
    ids = tokenizer.encode("🚀", add_special_tokens=False)
    assert len(ids) > 1  # byte-level BPE splits the rocket across tokens
    detok = IncrementalDetokenizer(tokenizer)
    assert detok.add(ids[:1]) == ""
    assert detok.add(ids[1:]) == "🚀"


def test_special_tokens_are_skipped(tokenizer):
    detok = IncrementalDetokenizer(tokenizer)
    assert detok.add([1]) + detok.add(tokenizer.encode("hi", add_special_tokens=False)) == "hi"


def test_random_token_streams_concatenate_to_decode(tokenizer):
    import random

    rng = random.Random(0)
    # Byte-fallback tokens (single bytes, many invalid alone) mixed with ordinary ones.
    byte_tokens = tokenizer.encode("é東🚀ü😀", add_special_tokens=False)
    for _ in range(200):
        ids = [
            rng.choice(byte_tokens) if rng.random() < 0.5 else rng.randrange(3, 49152)
            for _ in range(rng.randrange(1, 40))
        ]
        detok = IncrementalDetokenizer(tokenizer)
        step = rng.randrange(1, 4)
        deltas = [detok.add(ids[i : i + step]) for i in range(0, len(ids), step)]
        assert "".join(deltas) + detok.flush() == tokenizer.decode(ids, skip_special_tokens=True)


def _stream(tokenizer, text: str, stop: list[str], matched: str | None):
    """Feed `text` token by token; the last token ends the request with `matched`."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = RequestDetokenizer(tokenizer, stop)
    deltas = [detok.add([i], False, None) for i in ids[:-1]]
    deltas.append(detok.add(ids[-1:], True, matched))
    return deltas, detok.text


def test_stop_string_is_cut_and_never_streamed(tokenizer):
    deltas, text = _stream(tokenizer, "Hello world. END", ["END"], "END")
    assert text == "Hello world. "
    assert "".join(deltas) == text
    assert not any("E" in d for d in deltas)


def test_possible_stop_prefix_is_held_until_decided(tokenizer):
    # "wor" could start the stop string "world!" until "ld?" shows it does not.
    ids = tokenizer.encode("Hello wor", add_special_tokens=False)
    detok = RequestDetokenizer(tokenizer, ["world!"])
    sent = "".join(detok.add([i], False, None) for i in ids)
    assert sent == "Hello "
    rest = detok.add(tokenizer.encode("ld?", add_special_tokens=False), True, None)
    assert sent + rest == "Hello world?" == detok.text


def test_length_finish_flushes_held_text(tokenizer):
    deltas, text = _stream(tokenizer, "counting to fi", ["five"], None)
    assert "".join(deltas) == text == "counting to fi"


@pytest.mark.parametrize("keep", [False, True])
def test_matched_stop_token_text_is_left_out_unless_kept(tokenizer, keep):
    ids = tokenizer.encode("oranges: 2\n", add_special_tokens=False)
    newline = ids[-1]
    assert tokenizer.decode([newline]) == "\n"
    detok = RequestDetokenizer(tokenizer, no_stop_trim=keep)
    sent = "".join(detok.add([i], False, None) for i in ids[:-1])
    sent += detok.add([newline], True, newline)
    assert sent == detok.text == ("oranges: 2\n" if keep else "oranges: 2")
    # a stop token that is not the step's last token (none was matched) stays
    other = RequestDetokenizer(tokenizer)
    assert other.add(ids, True, None) == "oranges: 2\n"
