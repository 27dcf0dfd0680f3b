"""Exact AR-mode likelihoods: the scorer (:mod:`.scorer`, log-probabilities of given continuations) and
the API on top of it (:mod:`.likelihoods`, ``S2D2Model.loglikelihood`` and rolling perplexity windows)."""

from .likelihoods import Likelihoods
from .scorer import Scorer, TokenScores

__all__ = ["Likelihoods", "Scorer", "TokenScores"]
