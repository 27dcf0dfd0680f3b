"""The decoding layer: drafting, verifying, accepting, routing policies and baselines."""
