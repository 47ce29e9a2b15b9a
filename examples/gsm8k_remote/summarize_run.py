"""After the main job: per-step table, a few samples with their rewards, a plot, and where things are.

    python summarize_run.py WORK_DIR

Reads ``WORK_DIR/metrics.jsonl`` (verl's ``file`` logger), ``WORK_DIR/rollouts/<step>.jsonl``
(verl's ``trainer.rollout_data_dir`` dump) and ``WORK_DIR/checkpoints``; writes
``WORK_DIR/metrics.png`` (reward, response length and policy loss per step; needs Pillow, which
verl's tensorboard dependency brings).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COLUMNS = {
    "critic/score/mean": "reward",
    "response_length/mean": "resp_len",
    "actor/pg_loss": "pg_loss",
    "actor/grad_norm": "grad_norm",
    "perf/mfu/actor": "mfu_update",
    "timing_s/gen": "gen_s",
    "timing_s/update_actor": "update_s",
    "timing_s/step": "step_s",
}
PLOTTED = ("critic/score/mean", "response_length/mean", "actor/pg_loss")


def training_rows(metrics_path: Path) -> list[dict]:
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    return [row for row in rows if "timing_s/step" in row["data"]]  # not validation-only entries


def print_table(rows: list[dict]) -> None:
    print("[gsm8k-local] per-step summary")
    print("step " + " ".join(f"{label:>10}" for label in COLUMNS.values()))
    for row in rows:
        print(f"{row['step']:>4} " + " ".join(f"{row['data'].get(k, float('nan')):>10.4g}" for k in COLUMNS))


def print_samples(rollout_dir: Path, step: int, count: int = 2) -> None:
    path = rollout_dir / f"{step}.jsonl"
    if not path.exists():
        return
    samples = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    samples.sort(key=lambda s: -float(s.get("score", 0.0)))  # the best first, then the worst
    picked = samples[:1] + samples[-(count - 1) :] if len(samples) > 1 else samples
    for sample in picked:
        text = " ".join(str(sample.get("output", "")).split())
        print(f"  step {step} reward {float(sample.get('score', 0.0)):.2f} (answer {sample.get('gts')}): {text[:160]}")


def write_plot(rows: list[dict], path: Path) -> bool:
    """Three small line charts side by side; ``False`` when Pillow is missing."""
    try:
        from PIL import Image, ImageDraw
    except ImportError:
        return False
    width, height, pad = 300, 220, 36
    image = Image.new("RGB", (width * len(PLOTTED), height), "white")
    draw = ImageDraw.Draw(image)
    steps = [row["step"] for row in rows]
    for panel, key in enumerate(PLOTTED):
        left = panel * width
        values = [float(row["data"].get(key, float("nan"))) for row in rows]
        finite = [v for v in values if v == v]
        draw.text((left + pad, 8), key, fill="black")
        draw.rectangle([left + pad, pad, left + width - 12, height - pad], outline="black")
        if not finite:
            continue
        low, high = min(finite), max(finite)
        span = (high - low) or 1.0
        first, last = min(steps), max(steps)

        def point(step: int, value: float) -> tuple[float, float]:
            x = left + pad + (step - first) / max(last - first, 1) * (width - 12 - pad)
            y = height - pad - (value - low) / span * (height - 2 * pad)
            return x, y

        points = [point(s, v) for s, v in zip(steps, values) if v == v]
        if len(points) > 1:
            draw.line(points, fill="blue", width=2)
        for x, y in points:
            draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill="blue")
        draw.text((left + 2, pad - 4), f"{high:.3g}", fill="black")
        draw.text((left + 2, height - pad - 8), f"{low:.3g}", fill="black")
        draw.text((left + pad, height - pad + 6), f"step {first}", fill="black")
        draw.text((left + width - 60, height - pad + 6), f"step {last}", fill="black")
    image.save(path)
    return True


def main(argv: list[str]) -> int:
    work = Path(argv[0])
    metrics = work / "metrics.jsonl"
    rows = training_rows(metrics)
    if not rows:
        print(f"[gsm8k-local] no training steps logged in {metrics}")
        return 1
    print_table(rows)
    rollouts = work / "rollouts"
    print("[gsm8k-local] samples (best and worst of the first and the last step):")
    for step in sorted({rows[0]["step"], rows[-1]["step"]}):
        print_samples(rollouts, step)
    plot = work / "metrics.png"
    ckpt = work / "checkpoints"
    tracker = ckpt / "latest_checkpointed_iteration.txt"
    print(f"[gsm8k-local] metrics: {metrics}")
    if write_plot(rows, plot):
        print(f"[gsm8k-local] plot: {plot}")
    if tracker.exists():
        step_dir = ckpt / f"global_step_{tracker.read_text().strip()}"
        print(f"[gsm8k-local] checkpoint: {step_dir} (Hugging Face export: {step_dir / 'actor' / 'huggingface'})")
    print(f"[gsm8k-local] full log: {work / 'run.log'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
