"""Training code for the built-in tiny models."""
