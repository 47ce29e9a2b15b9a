"""The main job's gsm8k reward: correctness, with a small credit for a worked answer.

verl's own gsm8k score (``verl.utils.reward_score.gsm8k``, strict) gives 1 only for
``#### <correct number>`` and 0 otherwise. A 135M model almost never writes that format at
first, so every sample of a GRPO group scores 0, the advantages are 0 and nothing is learnt in
a few steps. This reward keeps verl's format for a full score and adds partial credit.

The answer ends at the first ``#### <number>``: what follows is not read, as if the sampler
had stopped there (evaluation harnesses stop gsm8k generation the same way). A small model
that does not stop goes on to invent the next "Question: ... #### <number>"; verl's rule reads
the last ``####`` and would score that invented answer instead.

* 1.0   the number after the first ``####`` equals the reference answer (verl's strict format);
* 0.5   no ``####``, but the last number in the response equals the reference;
* 0.1   a worked answer with a wrong number: the number after the first ``####`` is the result
        of an equation written before it (``... = <number>``), and the work uses a number of
        the question (when ``extra_info["question"]`` is given);
* 0.0   otherwise.

Why the 0.1 asks for work: a credit for the bare format is learnt in three steps as
``#### 10 #### 10 ...`` (measured: the policy copied the prompt's worked example and repeated
its answer line), which scores the credit without solving anything.

verl calls it as ``reward.custom_reward_function.path=<this file>``, ``name=gsm8k_shaped``.
"""

from __future__ import annotations

import re
from typing import Any, Optional

_FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)")
_NUMBER = re.compile(r"-?[\d,]*\.?\d+")
_RESULT = re.compile(r"=\s*\$?(-?[\d,]*\.?\d+)")


def _normalise(number: str) -> str:
    return number.replace(",", "").rstrip(".")


def _shows_work(work: str, answer: str, question: Optional[str]) -> bool:
    """Whether ``work`` (the text before ``####``) derives ``answer`` in an equation and, when the
    question is known, uses one of its numbers."""
    if answer not in {_normalise(n) for n in _RESULT.findall(work)}:
        return False
    if not question:
        return True
    given = {_normalise(n) for n in _NUMBER.findall(question)}
    return bool(given & {_normalise(n) for n in _NUMBER.findall(work)})


def gsm8k_shaped(data_source: str, solution_str: str, ground_truth: Any, extra_info: Optional[dict] = None) -> float:
    """Score one response (see module docstring); ``ground_truth`` is gsm8k's final number and
    ``extra_info`` the dataset row's (``prepare_gsm8k.py`` puts the question there)."""
    truth = _normalise(str(ground_truth))
    final = _FINAL.search(solution_str)
    if final:
        answer = _normalise(final.group(1))
        if answer == truth:
            return 1.0
        work = solution_str[: final.start()]
        return 0.1 if _shows_work(work, answer, (extra_info or {}).get("question")) else 0.0
    numbers = _NUMBER.findall(solution_str)
    if numbers and _normalise(numbers[-1]) == truth:
        return 0.5
    return 0.0
