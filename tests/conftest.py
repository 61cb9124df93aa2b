"""Shared test settings: one compute thread per process (fastest on shared 2-core machines)."""

import torch

torch.set_num_threads(1)
