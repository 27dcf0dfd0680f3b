"""The batched decoding engine with continuous batching (requests, scheduler, runner, step)."""
