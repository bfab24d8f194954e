"""Evaluating a trained policy on an env's fixed protocol (docs/training.md#evaluation)."""
