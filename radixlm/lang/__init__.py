"""The radixlm language: multi-call and branching programs (gen, select, fork). Built in a later issue."""
