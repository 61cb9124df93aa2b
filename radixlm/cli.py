"""The `radixlm` command: `serve` (OpenAI-compatible HTTP server), `generate` (one completion
in-process), `bench` (serving benchmark client), `eval` (compare
configurations, e.g. quantized, with a baseline), `train-eagle` (train an EAGLE
speculative-decoding head) and `plan` (serving planner)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

from radixlm.config import HTTP_ONLY_FIELDS, ServerArgs
from radixlm.errors import RadixLMError


def _with_step_prior(server_args: ServerArgs) -> ServerArgs:
    """With SLO scheduling on and no --slo-step-prior, the planner's roofline fit for the
    model on this device (`radixlm/plan/step_prior.py`; unchanged when it has none)."""
    if server_args.slo_step_prior is not None or (
        server_args.slo_ttft_ms is None and server_args.slo_tpot_ms is None
    ):
        return server_args
    import torch

    from radixlm.plan.step_prior import serving_step_prior

    a = server_args
    cuda = a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available())
    gpu = torch.cuda.get_device_name(0) if cuda else None
    prior = serving_step_prior(a.model, "cuda" if cuda else "cpu", a.dtype, a.kv_cache_dtype, gpu)
    return dataclasses.replace(a, slo_step_prior=prior)


def _generate(args: argparse.Namespace) -> int:
    from radixlm.runtime.engine import Engine
    from radixlm.runtime.sampling.sampler import SamplingParams

    server_args = _with_step_prior(ServerArgs.from_cli_args(args))  # checked before loading
    params = {
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "min_p": args.min_p,
        "stop_token_ids": args.stop_token_ids,
        "ignore_eos": args.ignore_eos,
    }
    if args.seed is not None:
        params["seed"] = args.seed
    params = SamplingParams.from_any(params)
    engine = Engine(**dataclasses.asdict(server_args))
    prompt = args.prompt
    if args.chat:
        prompt = engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
    with engine:
        for chunk in engine.generate(prompt, params, stream=True):
            sys.stdout.write(chunk["text"])
            sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from radixlm.frontend.launch import launch_server

    return launch_server(_with_step_prior(ServerArgs.from_cli_args(args)))


def _router(args: argparse.Namespace) -> int:
    from radixlm.frontend.router_launch import run_router

    return run_router(args)


def _train_eagle(args: argparse.Namespace) -> int:
    from radixlm.train.eagle import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `radixlm` command."""
    parser = argparse.ArgumentParser(prog="radixlm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser(
        "serve",
        help="serve a model over HTTP (OpenAI-compatible and native routes)",
        description="Start the scheduler and detokenizer processes and an OpenAI-compatible "
        "HTTP server; prints the URL once the model is loaded. Stop with Ctrl-C or SIGTERM.",
    )
    ServerArgs.add_cli_args(serve)
    serve.set_defaults(func=_serve)

    gen = sub.add_parser("generate", help="generate one completion in-process and print it")
    gen.add_argument("--prompt", required=True, help="prompt text")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    gen.add_argument(
        "--max-new-tokens", type=int, default=64, help="tokens to generate at most (default: 64)"
    )
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: 0)")
    gen.add_argument(
        "--top-p", type=float, default=1.0, help="nucleus sampling mass (default: 1.0)"
    )
    gen.add_argument(
        "--top-k", type=int, default=-1, help="keep the k most likely tokens (default: -1 = all)"
    )
    gen.add_argument(
        "--min-p", type=float, default=0.0, help="drop tokens below min_p * p_max (default: 0)"
    )
    gen.add_argument("--seed", type=int, default=None, help="sampling seed (default: none)")
    gen.add_argument(
        "--stop-token-ids",
        type=int,
        nargs="*",
        default=[],
        help="extra token ids that end generation",
    )
    gen.add_argument("--ignore-eos", action="store_true", help="keep generating past EOS")
    ServerArgs.add_cli_args(gen, exclude=HTTP_ONLY_FIELDS)
    gen.set_defaults(func=_generate)

    router = sub.add_parser(
        "router",
        help="route requests over several `radixlm serve` workers (docs/scale-out.md)",
        description="One HTTP endpoint in front of `radixlm serve` workers: cache-aware or "
        "other routing, health checks, removal and re-admission of failed workers, retries "
        "of requests that never reached a worker, streaming and abort pass-through.",
    )
    from radixlm.frontend.router_launch import add_router_args

    add_router_args(router)
    router.set_defaults(func=_router)

    from radixlm.bench.cli import register as register_bench

    register_bench(sub)
    from radixlm.eval.cli import register as register_eval

    register_eval(sub)
    train = sub.add_parser(
        "train-eagle",
        help="train an EAGLE speculative-decoding head for a model (self-distillation)",
        description="Generate answers with the model, read its hidden states, and train an "
        "EAGLE draft head on them; load it with --speculative-algorithm eagle "
        "--speculative-draft-path DIR.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    from radixlm.train.args import add_args as _train_args

    _train_args(train)
    train.set_defaults(func=_train_eagle)

    try:
        from radixlm.plan.cli import register
    except ImportError:
        pass
    else:
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `radixlm` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    level = getattr(args, "log_level", "info").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except (RadixLMError, ValueError) as e:
        print(f"radixlm: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
