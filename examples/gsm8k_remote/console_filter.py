"""Console view of a run: our own lines, one short line per step, and failures; the rest goes to the log.

    python -m verl.remote_backend.main_ppo ... 2>&1 | python console_filter.py RUN_LOG

Every input line is appended to ``RUN_LOG``; the console gets ``[remote_backend]`` and
``[gsm8k-local]`` lines, verl's per-step metrics line shortened to the numbers that matter, and,
once a failure shows (``run failed``, a traceback, ``Error``), everything from there on.
"""

from __future__ import annotations

import re
import signal
import sys
from typing import Optional

STEP = re.compile(r"step:(\d+) - (.*)")
SHOWN = {
    "critic/score/mean": "reward",
    "response_length/mean": "resp_len",
    "actor/pg_loss": "pg_loss",
    "actor/grad_norm": "grad_norm",
    "timing_s/step": "step_s",
}
FAILURE = ("run failed", "Traceback (most recent call last)", "Error executing job", "interrupted (Ctrl-C)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
NUMPY_SCALAR = re.compile(r"np\.\w+\((.*)\)")


def step_metrics(line: str) -> Optional[tuple[int, dict[str, float]]]:
    """``(step, {name: value})`` of verl's console metrics line ``step:N - name:value - ...``
    (numeric values only), or None for any other line."""
    match = STEP.search(ANSI.sub("", line))
    if not match:
        return None
    values = {}
    for item in match.group(2).split(" - "):
        name, colon, text = item.rpartition(":")
        if not colon:
            continue
        scalar = NUMPY_SCALAR.fullmatch(text.strip())  # numpy >= 2 prints np.float64(0.5)
        try:
            values[name.strip()] = float(scalar.group(1) if scalar else text)
        except ValueError:
            continue
    return int(match.group(1)), values


def short_step_line(step: int, values: dict[str, float]) -> str:
    """The step's shown numbers; a validation at that step (step 0: before training) adds
    ``val_score``, verl's mean reward over the held-out prompts (``val-core/<source>/.../mean@1``)."""
    parts = [f"{label}={values[key]:.4g}" for key, label in SHOWN.items() if key in values]
    parts += [f"val_score={v:.4g}" for k, v in values.items() if k.startswith("val-core/") and k.endswith("/mean@1")]
    return f"[gsm8k-local] step {step}: " + " ".join(parts)


def main(log_path: str) -> int:
    # A terminal's Ctrl-C reaches the whole pipeline: keep reading until the run has printed its
    # interrupt report and closed the pipe.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    failing = False
    with open(log_path, "a", errors="replace") as log:
        for raw in sys.stdin:
            log.write(raw)
            log.flush()
            line = ANSI.sub("", raw.rstrip("\n"))
            failing = failing or any(marker in line for marker in FAILURE)
            if failing:
                print(line, flush=True)
                continue
            step = step_metrics(line)
            if step:
                print(short_step_line(*step), flush=True)
            elif "[remote_backend]" in line or line.startswith("[gsm8k-local]"):
                print(line[line.find("[") :] if "[remote_backend]" in line else line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
