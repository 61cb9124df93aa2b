"""Benchmark workloads as sessions of turns.

A `Session` is a list of turns run one after another; single-request workloads have
one turn per session. In a multi-turn session (`resend_history`), turn k's prompt is
turn k-1's prompt + turn k-1's answer (as generated) + turn k's text, so the history
grows and is resent, as agent loops and chat clients do.

Prompts are text built from token ids: random ids from the tokenizer's vocabulary
(special tokens excluded), decoded to text. Re-encoding the text may give a slightly
different length; the benchmark reports the server's own prompt token counts.

Workloads (SGLang bench_serving names):
    random                   N requests, input length uniform in
                             [input_len * range_ratio, input_len], output likewise
    generated-shared-prefix  G groups x P prompts: a group's system prompt (S tokens)
                             + a question of Q tokens; requests shuffled
    multi-turn               N sessions x T turns; the first turn has S tokens of
                             context, each turn adds Q tokens of user text
    sharegpt                 first human turn of each conversation in a ShareGPT JSON
                             file; output length = the reference answer's tokens
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Turn:
    """One request: its prompt (text or token ids; in a multi-turn session, what this
    turn adds to the history) and its output length in tokens."""

    text: str | list[int]
    output_len: int


@dataclass(frozen=True)
class Session:
    """Turns run in order; with resend_history each prompt includes the history."""

    turns: tuple[Turn, ...]
    resend_history: bool = False

    def num_requests(self) -> int:
        return len(self.turns)


class TokenText:
    """Random text of a given token length from a tokenizer's vocabulary.

    Args: tokenizer (Hugging Face), seed. Token ids are drawn uniformly from the ids
    below len(tokenizer) that are not special tokens.
    """

    def __init__(self, tokenizer, seed: int = 0):
        self.tokenizer = tokenizer
        self.rng = random.Random(seed)
        special = set(tokenizer.all_special_ids)
        self._ids = [i for i in range(len(tokenizer)) if i not in special]

    def text(self, n_tokens: int) -> str:
        """Decoded text of `n_tokens` random token ids (empty for n_tokens <= 0)."""
        ids = [self.rng.choice(self._ids) for _ in range(max(n_tokens, 0))]
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def _sample_len(rng: random.Random, n: int, range_ratio: float) -> int:
    low = max(int(n * range_ratio), 1)
    return rng.randint(low, max(n, low))


def random_workload(
    tokenizer,
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float = 1.0,
    seed: int = 0,
) -> list[Session]:
    """`num_prompts` independent requests with lengths uniform in [len * ratio, len]."""
    if not 0.0 <= range_ratio <= 1.0:
        raise ValueError(f"range_ratio must be in [0, 1], got {range_ratio}")
    gen = TokenText(tokenizer, seed)
    rng = random.Random(seed + 1)
    sessions = []
    for _ in range(num_prompts):
        text = gen.text(_sample_len(rng, input_len, range_ratio))
        sessions.append(Session((Turn(text, _sample_len(rng, output_len, range_ratio)),)))
    return sessions


def shared_prefix_workload(
    tokenizer,
    num_groups: int,
    prompts_per_group: int,
    system_len: int,
    question_len: int,
    output_len: int,
    seed: int = 0,
    shuffle: bool = True,
) -> list[Session]:
    """G x P requests: group g's system prompt (system_len tokens) + its own question."""
    gen = TokenText(tokenizer, seed)
    sessions = []
    for _ in range(num_groups):
        system = gen.text(system_len)
        for _ in range(prompts_per_group):
            question = gen.text(question_len)
            sessions.append(Session((Turn(system + question, output_len),)))
    if shuffle:
        random.Random(seed + 1).shuffle(sessions)
    return sessions


def multi_turn_workload(
    tokenizer,
    num_sessions: int,
    num_turns: int,
    system_len: int,
    turn_len: int,
    output_len: int,
    seed: int = 0,
) -> list[Session]:
    """Sessions whose turns resend the growing history (see the module docstring)."""
    gen = TokenText(tokenizer, seed)
    sessions = []
    for _ in range(num_sessions):
        turns = [Turn(gen.text(system_len) + gen.text(turn_len), output_len)]
        turns += [Turn(gen.text(turn_len), output_len) for _ in range(num_turns - 1)]
        sessions.append(Session(tuple(turns), resend_history=True))
    return sessions


SHAREGPT_FORMAT = 'a JSON list of {"conversations": [{"from": ..., "value": TEXT}, ...]}'


def read_sharegpt(path: str | Path) -> list[tuple[str, str]]:
    """(prompt, reference answer) pairs, in file order, of a ShareGPT-style JSON file:
    the first two turns' "value" texts of each {"conversations" (or "conversation"):
    [...]} entry; entries with fewer than two text turns are skipped.

    Raises:
        ValueError: one line naming `path` when the file is missing or unreadable, is
            not JSON (UTF-8), or holds no conversation in that format.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"dataset file {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"dataset file {str(path)!r} is a directory") from None
    except OSError as e:
        raise ValueError(f"cannot read dataset file {str(path)!r}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"dataset file {str(path)!r} is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise ValueError(
            f"dataset file {str(path)!r} is not valid JSON ({e.msg} at line {e.lineno} "
            f"column {e.colno}); expected {SHAREGPT_FORMAT}"
        ) from None
    if not isinstance(data, list):
        raise ValueError(
            f"dataset file {str(path)!r} is not a JSON list; expected {SHAREGPT_FORMAT}"
        )
    pairs = []
    for entry in data:
        conv = (
            entry.get("conversations") or entry.get("conversation")
            if isinstance(entry, dict)
            else None
        )
        if not isinstance(conv, list) or len(conv) < 2:
            continue
        texts = [t.get("value") if isinstance(t, dict) else None for t in conv[:2]]
        if all(isinstance(t, str) for t in texts):
            pairs.append((texts[0], texts[1]))
    if not pairs:
        raise ValueError(
            f"dataset file {str(path)!r} has no conversation with two text turns "
            f"among its {len(data)} entries; expected {SHAREGPT_FORMAT}"
        )
    return pairs


def sharegpt_workload(
    tokenizer,
    path: str | Path | list[tuple[str, str]],
    num_prompts: int,
    output_len: int | None = None,
    seed: int = 0,
    max_prompt_len: int = 1024,
    max_total_len: int = 2048,
) -> list[Session]:
    """Requests from a ShareGPT-style JSON file (see `read_sharegpt`), or from its
    already read (prompt, answer) pairs: the pairs are shuffled (seeded) and taken in
    turn; conversations with prompts under 4 tokens, answers under 4 tokens (unless
    `output_len` is given), prompts over `max_prompt_len` or totals over `max_total_len`
    are skipped (as SGLang's client does). Raises ValueError for a malformed file or
    when no conversation is within those limits."""
    pairs = list(path) if isinstance(path, list) else read_sharegpt(path)
    random.Random(seed).shuffle(pairs)
    sessions = []
    for prompt, answer in pairs:
        if len(sessions) == num_prompts:
            break
        n_in = len(tokenizer.encode(prompt, add_special_tokens=False))
        n_out = output_len or len(tokenizer.encode(answer, add_special_tokens=False))
        if n_in < 4 or n_out < 4 or n_in > max_prompt_len or n_in + n_out > max_total_len:
            continue
        sessions.append(Session((Turn(prompt, n_out),)))
    if not sessions:
        raise ValueError(
            f"none of the dataset's {len(pairs)} conversations fits: prompts need 4 to "
            f"{max_prompt_len} tokens, answers at least 4 (or --sharegpt-output-len), "
            f"prompt + answer at most {max_total_len}"
        )
    return sessions
