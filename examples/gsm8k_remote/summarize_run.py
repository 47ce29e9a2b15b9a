"""After the main job: per-step table, a few samples with their rewards, a plot, and where things are.

    python summarize_run.py WORK_DIR

Reads ``WORK_DIR/metrics.jsonl`` (verl's ``file`` logger), ``WORK_DIR/rollouts/<step>.jsonl``
(verl's ``trainer.rollout_data_dir`` dump) and ``WORK_DIR/checkpoints``; writes
``WORK_DIR/metrics.png`` (reward, response length, policy loss and step time per step, drawn with
matplotlib) and names verl's tensorboard log folder, ``WORK_DIR/tensorboard``.
"""

from __future__ import annotations

import json
import statistics
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
#: Plotted metrics and their axis labels.
PLOTTED = {
    "critic/score/mean": "mean reward",
    "response_length/mean": "mean response length (tokens)",
    "actor/pg_loss": "policy loss",
    "timing_s/step": "step time (s)",
}


def logged_rows(metrics_path: Path) -> list[dict]:
    """verl's file-logger rows ``{"step", "data"}``, in the order they were written."""
    return [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]


def training_rows(metrics_path: Path) -> list[dict]:
    return [row for row in logged_rows(metrics_path) if "timing_s/step" in row["data"]]  # not validation-only


def validation_scores(metrics_path: Path) -> list[tuple[int, float]]:
    """``(step, score)`` of each validation verl logged (step 0: before training): the mean reward
    over the held-out prompts, verl's ``val-core/<data source>/<key>/mean@1``."""
    scores = []
    for row in logged_rows(metrics_path):
        values = [v for k, v in row["data"].items() if k.startswith("val-core/") and k.endswith("/mean@1")]
        if values:
            scores.append((int(row["step"]), float(values[0])))
    return scores


def learning_verdict(rewards: list[float]) -> str:
    """Whether the reward rose: the mean of the last quarter of steps against the first
    quarter's, by more than the step-to-step spread (standard deviation of the differences
    between consecutive steps). Needs 4 steps or more."""
    if len(rewards) < 4:
        return f"{len(rewards)} steps: too few to judge (4 or more)"
    quarter = max(1, len(rewards) // 4)
    first, last = statistics.mean(rewards[:quarter]), statistics.mean(rewards[-quarter:])
    spread = statistics.pstdev([b - a for a, b in zip(rewards, rewards[1:])])
    rose = last - first > spread
    return (
        f"mean reward of the first {quarter} step(s) {first:.4g}, of the last {quarter} {last:.4g}, "
        f"step-to-step spread {spread:.4g}: {'rising' if rose else 'not clearly rising'}"
    )


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


def write_plot(rows: list[dict], path: Path) -> None:
    """One matplotlib figure, a panel per :data:`PLOTTED` metric against the training step, with
    axis labels; written to ``path`` (PNG) without a display (Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    steps = [row["step"] for row in rows]
    fig, axes = plt.subplots(1, len(PLOTTED), figsize=(4 * len(PLOTTED), 3.2), constrained_layout=True)
    for ax, (key, label) in zip(axes, PLOTTED.items()):
        values = [float(row["data"].get(key, float("nan"))) for row in rows]
        ax.plot(steps, values, marker="o")
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("training step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.suptitle("GRPO on gsm8k, local backend")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str]) -> int:
    work = Path(argv[0])
    metrics = work / "metrics.jsonl"
    rows = training_rows(metrics)
    if not rows:
        print(f"[gsm8k-local] no training steps logged in {metrics}")
        return 1
    print_table(rows)
    print("[gsm8k-local] learning: " + learning_verdict([float(r["data"].get("critic/score/mean", 0.0)) for r in rows]))
    scores = validation_scores(metrics)
    if scores:
        shown = ", ".join(
            ("before training" if step == 0 else f"after step {step}") + f" {score:.4g}" for step, score in scores
        )
        print(f"[gsm8k-local] validation (mean reward on the held-out prompts): {shown}")
    rollouts = work / "rollouts"
    print("[gsm8k-local] samples (best and worst of the first and the last step):")
    for step in sorted({rows[0]["step"], rows[-1]["step"]}):
        print_samples(rollouts, step)
    plot = work / "metrics.png"
    ckpt = work / "checkpoints"
    tracker = ckpt / "latest_checkpointed_iteration.txt"
    print(f"[gsm8k-local] metrics: {metrics}")
    write_plot(rows, plot)
    print(f"[gsm8k-local] plot: {plot}")
    tensorboard = work / "tensorboard"
    if tensorboard.is_dir():
        print(f"[gsm8k-local] tensorboard: tensorboard --logdir {tensorboard}")
    if tracker.exists():
        step_dir = ckpt / f"global_step_{tracker.read_text().strip()}"
        print(f"[gsm8k-local] checkpoint: {step_dir} (Hugging Face export: {step_dir / 'actor' / 'huggingface'})")
    print(f"[gsm8k-local] full log: {work / 'run.log'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
