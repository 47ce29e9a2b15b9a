"""The main job's gsm8k reward: correctness, with a small credit for the answer format.

verl's own gsm8k score (``verl.utils.reward_score.gsm8k``, strict) gives 1 only for
``#### <correct number>`` and 0 otherwise. A 135M model almost never writes that format at
first, so every sample of a GRPO group scores 0, the advantages are 0 and nothing is learnt in
a few steps. This reward keeps verl's rule for a full score and adds partial credit:

* 1.0   the number after ``####`` equals the reference answer (verl's strict rule);
* 0.5   no ``####``, but the last number in the response equals the reference;
* 0.1   a ``#### <number>`` line with a wrong number (the format the prompt asks for);
* 0.0   otherwise.

verl calls it as ``reward.custom_reward_function.path=<this file>``, ``name=gsm8k_shaped``.
"""

from __future__ import annotations

import re
from typing import Any, Optional

_FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)")
_NUMBER = re.compile(r"-?[\d,]*\.?\d+")


def _normalise(number: str) -> str:
    return number.replace(",", "").rstrip(".")


def gsm8k_shaped(data_source: str, solution_str: str, ground_truth: Any, extra_info: Optional[dict] = None) -> float:
    """Score one response (see module docstring); ``ground_truth`` is gsm8k's final number."""
    truth = _normalise(str(ground_truth))
    final = _FINAL.findall(solution_str)
    if final:
        return 1.0 if _normalise(final[-1]) == truth else 0.1
    numbers = _NUMBER.findall(solution_str)
    if numbers and _normalise(numbers[-1]) == truth:
        return 0.5
    return 0.0
