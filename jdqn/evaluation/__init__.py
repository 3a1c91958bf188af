"""Judging a policy: the trading environment, rollouts, baselines, statistics,
instruments and saved policies."""
