"""The radixlm language: multi-call, branching programs (gen, select, fork); a later issue."""
