"""Benchmark evaluation: accuracy and tool use of a policy on held-out problems."""
