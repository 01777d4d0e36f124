"""Evaluation: pass^k over repeated trials, critic metrics, reports and plots."""
