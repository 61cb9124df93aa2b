"""Jump-forward decoding: draft the text a grammar forces and verify it in one forward.

When a constrained request's grammar allows exactly one continuation string (xgrammar's
``GrammarMatcher.find_jump_forward_string``: a fixed JSON key, the rest of an enum
value once it is unambiguous, a regex literal), that string need not be decoded one
forward per token (the compressed finite-state machine of Zheng et al. 2024, "SGLang:
Efficient Execution of Structured Language Model Programs", section 4).

Tokens. SGLang appends the tokenizer's encoding of the string. But a model decoding
under the grammar mask often spells the same text with other tokens (SmolLM2-135M writes
``{`` ``"`` ``f`` ``ul`` ``l`` where its tokenizer writes ``{"`` ``full``), and the free
text it writes afterwards is conditioned on the spelling, so appended tokens change the
output. Here the encoding is a *draft*: the request computes it in one extend row, and
each position's token is chosen exactly as decoding would choose it (grammar mask, then
the request's own sampler and draw); drafted tokens are kept while they agree, and the
first chosen token that differs ends the step (`runtime/sched/jump.py`). The output is
therefore the output of ordinary constrained decoding, in fewer forwards wherever the
model spells the forced text as the tokenizer does.

Boundary. The string is encoded together with the text of the token sampled just before
it, since a BPE tokenizer may merge across that boundary; the draft is the part after
that token when the merge keeps it, else the string encoded alone. The last token of the
encoding is dropped when it is a strict prefix of a longer vocabulary token (it may be
extended by the free text after the string; xgrammar's rule in
``find_jump_forward_tokens``).

Spellings. Where the model spells forced text its own way, the tokenizer's draft loses
a forward at every token where the spellings part, and they part the same way on every
request of a schema (SmolLM2-135M spells ``employed":`` as ``em`` ``p`` ``lo`` ``ye``
``d`` ``"`` ``:``). So each request's chosen tokens for a forced text are remembered,
keyed by the token before them and the text (and, for every token boundary inside it,
by the token before and the rest of the text), and the next request at the same key
drafts the remembered spelling first. It is still only a draft: verification keeps the
output exact whatever is remembered.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any

#: Spellings are learned for forced texts of at most SPELLING_CHARS characters, over
#: their first SPELLING_TOKENS tokens: the keys hold the rest of the text at every
#: boundary, so a long regex literal would cost quadratic memory and decoding.
SPELLING_CHARS = 256
SPELLING_TOKENS = 64


def accepted_prefix(matcher: Any, ids: list[int]) -> int:
    """How many of `ids`, in order, the `xgrammar.GrammarMatcher` accepts from its
    current state (it stops at the first rejected token). Leaves the matcher unchanged."""
    accepted = 0
    for tok in ids:
        if not matcher.accept_token(tok):
            break
        accepted += 1
    if accepted:
        matcher.rollback(accepted)
    return accepted


class JumpForward:
    """Drafts a grammar's forced continuation as tokens.

    Args:
        tokenizer: the model's Hugging Face tokenizer (encodes the forced text; its
            vocabulary gives the strict-prefix set, built on first use).
        spellings: how many (token before, forced text) keys of the model's own
            spellings to remember, least recently used dropped first.

    Attributes:
        drafted / accepted: draft tokens proposed, and kept after verification (counted by
            the scheduler's forward step, `runtime/sched/forward_step.py`), so far.
    """

    def __init__(self, tokenizer, spellings: int = 4096):
        self.tokenizer = tokenizer
        self._prefixes: frozenset[str] | None = None
        self.drafted = 0
        self.accepted = 0
        self._capacity = spellings
        # (token before, forced text) -> the tokens the model chose for a prefix of it
        self._spellings: OrderedDict[tuple[int, str], tuple[int, ...]] = OrderedDict()
        # owner -> (len(output_ids), token before, forced text, covered) of the forced
        # text it has not finished; covered[k] is the text of its first k + 1 chosen
        # tokens. Weak keys: a finished request's entry goes with it.
        self._open: weakref.WeakKeyDictionary[Any, tuple[int, int, str, list[str]]] = (
            weakref.WeakKeyDictionary()
        )

    def draft(self, matcher: Any, output_ids: list[int], room: int, owner: Any = None) -> list[int]:
        """Tokens spelling the continuation forced after `matcher`'s accepted tokens.

        Args:
            matcher: the request's `xgrammar.GrammarMatcher`; it has accepted
                `output_ids` (at least one token). Left unchanged.
            output_ids: the request's output tokens so far.
            room: the most tokens to draft.
            owner: the request (any weakly referable object), whose chosen tokens for
                forced text are remembered as the model's spelling of it; None: none.

        Returns the draft, each token accepted by the grammar in turn; [] when nothing is
        forced or the forced text does not tokenize into tokens the grammar accepts.
        """
        if owner is not None:
            self._observe(owner, output_ids)
        forced = matcher.find_jump_forward_string() if room > 0 else ""
        if not forced:
            return []
        last = output_ids[-1]
        if owner is not None and owner not in self._open and len(forced) <= SPELLING_CHARS:
            self._open[owner] = (len(output_ids), last, forced, [])
        ids = list(self._spellings.get((last, forced), ()))[:room]
        if ids:
            self._spellings.move_to_end((last, forced))
            ids = ids[: accepted_prefix(matcher, ids)]
        if not ids:
            ids = self._trim(self._encode(forced, last))[:room]
            if accepted_prefix(matcher, ids) < len(ids):
                return []
        self.drafted += len(ids)
        return ids

    def _observe(self, owner: Any, output_ids: list[int]) -> None:
        """Remember the tokens `owner` chose for its open forced text once they reach its
        end, part from it (a token past its end, or one holding part of a UTF-8
        character, is left out) or number SPELLING_TOKENS: for each token boundary
        inside, (token before, rest of the text) -> the chosen tokens from there."""
        entry = self._open.get(owner)
        if entry is None:
            return
        start, last, forced, covered = entry  # covered[k]: the text of the first k + 1
        new = output_ids[start : start + SPELLING_TOKENS]
        if len(new) == len(covered) < SPELLING_TOKENS:
            return  # nothing emitted since the last look
        tok = self.tokenizer
        head = tok.decode([last])
        for k in range(len(covered), len(new)):  # only the tokens not yet looked at
            text = tok.decode([last, *new[: k + 1]])
            if not text.startswith(head) or "\ufffd" in text:
                break
            text = text[len(head) :]
            if not forced.startswith(text):
                break
            covered.append(text)
            if len(text) == len(forced):
                break
        else:
            if len(new) < SPELLING_TOKENS:
                return  # still inside the forced text
        del self._open[owner]
        chosen = tuple(new[: len(covered)])
        for k in range(len(chosen)):
            before = last if k == 0 else chosen[k - 1]
            rest = forced[len(covered[k - 1]) :] if k else forced
            self._spellings[(before, rest)] = chosen[k:]
            self._spellings.move_to_end((before, rest))
        while len(self._spellings) > self._capacity:
            self._spellings.popitem(last=False)

    def _encode(self, forced: str, last_token: int) -> list[int]:
        """Token ids of `forced` after `last_token`: the tail of their joint encoding when
        it keeps `last_token`, else `forced` encoded alone ([] if that is not exact)."""
        tok = self.tokenizer
        head = tok.decode([last_token])
        if head and "\ufffd" not in head:  # a whole character: safe to re-encode
            text = head + forced
            ids = tok.encode(text, add_special_tokens=False)
            if ids and ids[0] == last_token and tok.decode(ids) == text:
                return ids[1:]
        ids = tok.encode(forced, add_special_tokens=False)
        return ids if tok.decode(ids) == forced else []

    def _trim(self, ids: list[int]) -> list[int]:
        """`ids` without a last token that is a strict prefix of a longer token. Compared
        on the vocabulary's own token strings (byte-level or sentencepiece symbols), where
        prefixes are prefixes of the tokens' bytes."""
        if ids and self.tokenizer.convert_ids_to_tokens(ids[-1]) in self._strict_prefixes():
            return ids[:-1]
        return ids

    def _strict_prefixes(self) -> frozenset[str]:
        """Every strict prefix of every vocabulary token string (built on first use)."""
        if self._prefixes is None:
            vocab = self.tokenizer.get_vocab()
            self._prefixes = frozenset(t[:k] for t in vocab for k in range(1, len(t)))
        return self._prefixes
