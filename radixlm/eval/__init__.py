"""`radixlm eval`: compare candidate configurations of the engine (quantized weights, a
smaller KV cache dtype, another backend) against a baseline on the same prompts, offline.

- `configs`: a configuration is a set of engine flags (or a running server's URL).
- `tasks`: the prompts, generated from a seed or read from local JSONL files.
- `targets`: where prompts run: an in-process `radixlm.Engine` or `radixlm serve`.
- `metrics`: greedy agreement, top-k KL divergence, exact match, JSON validity, perplexity.
- `runner`: runs every task on each configuration in turn and compares with the baseline.
- `report`: the table and the JSON file.
- `lm_eval_bridge`: the same exact-match and perplexity tasks scored by lm-evaluation-harness
  against `radixlm serve`, when it is installed.
"""
