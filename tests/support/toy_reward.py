"""Reward of the learning test's toy task: the share of digit characters in the response.

A freshly initialised tiny model samples nearly uniformly from its vocabulary,
so some responses contain more digit tokens than others: the reward is dense
and varies within each GRPO group from the first step, and a policy that learns
to prefer digit tokens raises it towards 1. verl calls it as a custom reward
function (``reward.custom_reward_function.path/name``).
"""

from __future__ import annotations

from typing import Any, Optional


def digit_share(data_source: str, solution_str: str, ground_truth: Any, extra_info: Optional[dict] = None) -> float:
    """Fraction of the non-space characters of ``solution_str`` that are ASCII digits (0 for empty)."""
    chars = [c for c in solution_str if not c.isspace()]
    if not chars:
        return 0.0
    return sum(c.isdigit() for c in chars) / len(chars)
