"""Reward: pure reward math (prm, orm, pen, s[t], GRPO advantages), reader / judge clients, and the
Ray reward service that scores a finished rollout group. Map and choices: docs/reward.md."""
