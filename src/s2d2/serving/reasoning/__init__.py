"""Reasoning on the server: which reasoning parser a model's chat template calls for (:mod:`.detect`)."""
