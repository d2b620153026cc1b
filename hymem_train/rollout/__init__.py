"""Rollouts: workers that write windows through the harnesses, the window scheduler, bank lineage."""
