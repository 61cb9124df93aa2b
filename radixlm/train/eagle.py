"""`radixlm train-eagle`: train an EAGLE head for a model by self-distillation.

Data: the target answers chat prompts (`prompts.py`, greedy, through `radixlm.Engine`);
optionally a local text file adds raw text windows. The target then re-reads every
sequence once to give its normed last hidden states f and its greedy next tokens.
Training (Li et al. 2024, EAGLE): element p = (f_p + noise, t_{p+1}) must predict
f_{p+1} (smooth-L1, weight 1) and the target's next token argmax lm_head(f_{p+1})
(cross-entropy through the frozen shared lm_head, weight 0.1); AdamW, cosine decay,
stopped at --steps or --max-minutes of CPU time (the
cosine follows whichever is closer to its end). Saves `eagle.json` + `model.safetensors`.
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import shlex
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from radixlm.kernels import ForwardBatch, ForwardMode
from radixlm.runtime.speculative.eagle_head import (
    WEIGHTS_NAME,
    DenseCausalBackend,
    EagleConfig,
    EagleHead,
)
from radixlm.train.prompts import heldout_prompts, train_prompts

logger = logging.getLogger(__name__)


def _load_target(model: str):
    from transformers import AutoConfig, AutoTokenizer

    from radixlm.runtime.executor.model_registry import local_hf_dir
    from radixlm.runtime.executor.weights import load_model

    hf_dir = local_hf_dir(model)
    config = AutoConfig.from_pretrained(hf_dir)
    target = load_model(hf_dir, config, torch.float32, "cpu")
    for p in target.parameters():
        p.requires_grad_(False)
    return target, AutoTokenizer.from_pretrained(hf_dir)


def generate_sequences(args, tokenizer) -> list[list[int]]:
    """Prompt + greedy answer token ids for the first --num-prompts training prompts."""
    from tqdm import tqdm

    from radixlm.runtime.engine import Engine

    prompts = train_prompts()[: args.num_prompts]
    ids = [_chat(tokenizer, p) for p in prompts]
    seqs = []
    params = {"max_new_tokens": args.max_new_tokens, "temperature": 0}
    with Engine(args.model, max_running_requests=args.gen_batch, num_threads=args.num_threads,
                max_total_tokens=args.gen_batch * 512, log_level="warning") as engine:  # fmt: skip
        for i in tqdm(range(0, len(ids), args.gen_batch), desc="generate", unit="batch"):
            batch = ids[i : i + args.gen_batch]
            for p, out in zip(batch, engine.generate(batch, params)):
                seqs.append(p + out["output_ids"])
    return seqs


def _chat(tokenizer, text: str) -> list[int]:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True,
        return_dict=False,
    )  # fmt: skip


def text_sequences(path: str, tokenizer, max_tokens: int, seq_len: int) -> list[list[int]]:
    """Windows of seq_len tokens from the first max_tokens tokens of a text file."""
    text = Path(path).read_text(errors="replace")[: max_tokens * 8]
    ids = tokenizer.encode(text, add_special_tokens=False)[:max_tokens]
    return [ids[i : i + seq_len] for i in range(0, len(ids) - 1, seq_len)]


@torch.inference_mode()
def target_features(target, seqs: list[list[int]], seq_len: int):
    """Windows (tokens int64 [N, L], features float32 [N, L, H], next-token labels
    int64 [N, L] = argmax of the target at each position), L = seq_len (shorter tails
    padded with EOS-free repeats are dropped)."""
    from tqdm import tqdm

    attn = target.model.layers[0].self_attn
    backend = DenseCausalBackend(attn.head_dim**-0.5)
    target.capture_hidden = True
    toks, feats, labels = [], [], []
    windows = [s[i : i + seq_len] for s in seqs for i in range(0, len(s), seq_len)]
    windows = [w for w in windows if len(w) >= 16]
    for w in tqdm(windows, desc="features", unit="seq"):
        n = len(w)
        backend.shape = (1, n)
        fb = _dense_batch(torch.tensor(w), n)
        logits = target(fb, backend)
        f = target.last_hidden
        pad = seq_len - n
        toks.append(F.pad(torch.tensor(w), (0, pad), value=-1))
        feats.append(F.pad(f, (0, 0, 0, pad)))
        labels.append(F.pad(logits.argmax(-1), (0, pad), value=-1))
    target.capture_hidden = False
    return torch.stack(toks), torch.stack(feats), torch.stack(labels)


def _dense_batch(ids: torch.Tensor, n: int) -> ForwardBatch:
    z = torch.zeros(1, dtype=torch.int64)
    return ForwardBatch(
        mode=ForwardMode.TARGET_VERIFY,  # every token's logits / hidden state
        input_ids=ids,
        positions=torch.arange(ids.numel()) % n,
        out_cache_loc=z,
        req_pool_indices=z,
        seq_lens=z,
        extend_prefix_lens=z,
        extend_seq_lens=torch.tensor([ids.numel()]),
        req_to_token=z,
    )


def train(head: EagleHead, data, args, save=None) -> dict[str, float]:
    """Optimise the head on (tokens, features, labels); returns final metrics.

    The cross-entropy (through the 49k-row lm_head, most of a step's cost) is taken on
    a random --ce-fraction of the positions; `save()` runs every --save-every steps."""
    from tqdm import tqdm

    toks, feats, labels = data
    n, seq_len = toks.shape
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=args.lr,
                            weight_decay=0.0)  # fmt: skip
    backend = DenseCausalBackend(head.layer.self_attn.head_dim**-0.5)
    noise = 0.02 * float(feats[toks >= 0].std())
    gen = torch.Generator().manual_seed(args.seed)
    t0 = time.process_time()  # the limit is CPU time of this process
    metrics = {"loss": math.nan, "acc": math.nan}
    bar = tqdm(range(args.steps), desc="train", unit="step")
    for step in bar:
        done = max(step / args.steps, (time.process_time() - t0) / (args.max_minutes * 60))
        lr = args.lr * 0.5 * (1 + math.cos(math.pi * min(done, 1.0)))
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / 50)
        idx = torch.randint(0, n, (args.batch_size,), generator=gen)
        t, f, y = toks[idx], feats[idx], labels[idx]
        # element p: (f_p, t_{p+1}) -> f_{p+1}, label_{p+1}
        inp_tok, inp_f = t[:, 1:], f[:, :-1]
        tgt_f, tgt_y = f[:, 1:], y[:, 1:]
        valid = (inp_tok >= 0) & (tgt_y >= 0)
        inp_f = inp_f + noise * torch.randn(inp_f.shape, generator=gen)
        b, m = inp_tok.shape
        backend.shape = (b, m)
        fb = _dense_batch(inp_tok.clamp(min=0).reshape(-1), m)
        out = head(fb, backend, inp_f.reshape(b * m, -1)).view(b, m, -1)
        reg = F.smooth_l1_loss(out[valid], tgt_f[valid])
        pick = valid & (torch.rand(valid.shape, generator=gen) < args.ce_fraction)
        logits = head.lm_head(out[pick])
        cls = F.cross_entropy(logits, tgt_y[pick])
        loss = reg + 0.1 * cls
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        acc = (logits.argmax(-1) == tgt_y[pick]).float().mean().item()
        metrics = {"loss": loss.item(), "reg": reg.item(), "acc": acc}
        bar.set_postfix(loss=f"{metrics['loss']:.3f}", acc=f"{acc:.3f}")
        if save is not None and (step + 1) % args.save_every == 0:
            save()
        if time.process_time() - t0 > args.max_minutes * 60:
            logger.info("time limit reached after %d steps", step + 1)
            break
    metrics["steps"] = step + 1
    return metrics


def measure_acceptance(model: str, head_dir: str, prompts: list[str], max_new: int = 64,
                       num_steps: int = 4, topk: int = 1, num_draft: int = 4) -> dict:  # fmt: skip
    """Greedy decode `prompts` one at a time with the head; returns the scheduler's
    speculation counters (spec_accept_length = tokens per verify step)."""
    from radixlm.runtime.engine import Engine

    with Engine(model, speculative_algorithm="eagle", speculative_draft_path=head_dir,
                speculative_num_steps=num_steps, speculative_topk=topk,
                speculative_num_draft_tokens=num_draft, max_total_tokens=4096,
                log_level="warning") as engine:  # fmt: skip
        tok = engine.tokenizer
        for p in prompts:
            engine.generate(_chat(tok, p), {"max_new_tokens": max_new, "temperature": 0})
        return {k: v for k, v in engine.scheduler.stats().items() if k.startswith("spec_")}


def run(args: argparse.Namespace) -> int:
    """Entry point of `radixlm train-eagle`."""
    torch.set_num_threads(args.num_threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    target, tokenizer = _load_target(args.model)
    cache = Path(args.data_cache) if args.data_cache else None
    if cache is not None and cache.exists():
        seqs = torch.load(cache)
    else:
        seqs = generate_sequences(args, tokenizer) if args.num_prompts > 0 else []
        if cache is not None:
            torch.save(seqs, cache)
    if args.text_file:
        seqs += text_sequences(args.text_file, tokenizer, args.text_tokens, args.seq_len)
    if not seqs:
        raise ValueError("no training data: give --num-prompts > 0 or --text-file")
    data = target_features(target, seqs, args.seq_len)
    logger.info("training on %d windows (%d tokens)", len(data[0]), int((data[0] >= 0).sum()))
    tcfg = target.config
    attn = target.model.layers[0].self_attn
    cfg = EagleConfig(
        base_model=args.model,
        hidden_size=tcfg.hidden_size,
        intermediate_size=args.intermediate_size or tcfg.intermediate_size,
        num_attention_heads=attn.num_heads,
        num_key_value_heads=attn.num_kv_heads,
        head_dim=attn.head_dim,
        rms_norm_eps=tcfg.rms_norm_eps,
        train_command="radixlm train-eagle " + shlex.join(sys.argv[2:]),
    )
    head = EagleHead(cfg, tcfg, target.model.embed_tokens, target.lm_head)
    with torch.no_grad():  # smaller initial block weights: the fc input dominates early
        for p in head.layer.parameters():
            if p.dim() > 1:
                p.mul_(0.5)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        from safetensors.torch import save_file

        save_file(head.head_state_dict(), out / WEIGHTS_NAME)
        cfg.save(out)

    metrics = train(head, data, args, save)
    save()
    print(f"saved {out} ({(out / WEIGHTS_NAME).stat().st_size / 1e6:.1f} MB); {metrics}")
    if args.eval_prompts > 0:
        stats = measure_acceptance(args.model, str(out), heldout_prompts()[: args.eval_prompts])
        print(f"held-out acceptance: {stats}")
    return 0
