"""Built-in tasks (data sets) for the tiny models."""
