"""Flags of `radixlm train-eagle` (kept free of torch imports so the CLI starts fast)."""

from __future__ import annotations

import argparse


def add_args(p: argparse.ArgumentParser) -> None:
    """Flags of `radixlm train-eagle`."""
    p.add_argument("--model", required=True, help="target model (alias, HF dir or .gguf)")
    p.add_argument("--out", required=True, help="output directory for the head")
    p.add_argument("--text-file", default=None, help="extra plain-text training file")
    p.add_argument("--text-tokens", type=int, default=20000, help="tokens read from it")
    p.add_argument("--num-prompts", type=int, default=96, help="chat prompts answered")
    p.add_argument("--max-new-tokens", type=int, default=192, help="answer length")
    p.add_argument("--gen-batch", type=int, default=32, help="prompts generated together")
    p.add_argument("--seq-len", type=int, default=256, help="training window (tokens)")
    p.add_argument("--batch-size", type=int, default=4, help="windows per step")
    p.add_argument("--steps", type=int, default=3000, help="optimizer steps at most")
    p.add_argument("--max-minutes", type=float, default=12.0, help="training limit in CPU minutes")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    p.add_argument("--intermediate-size", type=int, default=None, help="head FFN width")
    p.add_argument("--ce-fraction", type=float, default=0.5, help="positions in the CE loss")
    p.add_argument("--save-every", type=int, default=50, help="checkpoint every N steps")
    p.add_argument("--data-cache", default=None, help="file keeping generated token ids")
    p.add_argument("--seed", type=int, default=0, help="RNG seed")
    p.add_argument("--eval-prompts", type=int, default=8, help="held-out prompts to score")
    p.add_argument("--num-threads", type=int, default=1, help="torch threads")
