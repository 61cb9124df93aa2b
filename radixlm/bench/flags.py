"""Value types for `radixlm bench` flags: each parses one command-line string or raises
`argparse.ArgumentTypeError`, so a bad value is an `error: argument --flag: ...` line and
exit status 2 before anything runs.

Request rates are requests (sessions) per second; `inf` means all at once. Lengths are
tokens; times are milliseconds.
"""

from __future__ import annotations

import argparse
import math


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if math.isnan(value):
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (counts, output lengths, concurrency)."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0 (input lengths that may be empty, such as a shared prefix)."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (SLOs in milliseconds)."""
    value = _float(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def request_rate(text: str) -> float:
    """A rate > 0 in requests/s, or `inf` (every session at once)."""
    value = _float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (or inf: all at once), got {text}")
    return value


def ratio(text: str) -> float:
    """A number in [0, 1]."""
    value = _float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def rate_list(text: str) -> str:
    """Comma-separated request rates such as '1,2,4,inf' (returned as given; parse with
    `radixlm.bench.sweep.parse_rates`). Raises ArgumentTypeError for an empty list or a
    rate that `request_rate` rejects."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected rates separated by commas, got {text!r}")
    for part in parts:
        request_rate(part)
    return text


def check_combinations(args: argparse.Namespace) -> None:
    """Checks between the parsed flags of `radixlm bench` that no single value type can
    make. Raises ValueError (one line) for a workload that would send empty prompts or
    lacks its file."""
    name = args.dataset_name
    if name == "sharegpt" and not args.dataset_path:
        raise ValueError("--dataset-name sharegpt needs --dataset-path FILE.json")
    if name == "generated-shared-prefix" and args.gsp_system_prompt_len + args.gsp_question_len < 1:
        raise ValueError(
            "--gsp-system-prompt-len and --gsp-question-len are both 0: the prompts would be empty"
        )
    if name == "multi-turn" and args.multi_turn_system_len + args.multi_turn_turn_len < 1:
        raise ValueError(
            "--multi-turn-system-len and --multi-turn-turn-len are both 0: the first turn's "
            "prompt would be empty"
        )
