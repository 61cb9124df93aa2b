"""Training helpers that drive an `Engine`: EAGLE draft-head self-distillation
(`radixlm train-eagle`)."""
