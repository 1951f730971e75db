"""Experiments behind the command-line jobs (training run, stability study)."""
