"""``python -m verl.remote_backend.testing --backend NAME [hydra overrides...]``: run the adapter
conformance kit and print one line per check; exit code 0 when no check failed, 1 otherwise."""

from __future__ import annotations

import argparse
import sys

from verl.remote_backend.testing.conformance import CHECKS, KitOptions, kit_config, run_conformance


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl.remote_backend.testing", description=__doc__)
    parser.add_argument("--backend", required=True, help="registered backend name (trainer.remote_backend)")
    parser.add_argument(
        "--alignment-tolerance",
        type=float,
        default=KitOptions.alignment_tolerance,
        help="max |sampler - trainer| log-prob of the same tokens (default %(default)g)",
    )
    parser.add_argument(
        "--batch-tolerance",
        type=float,
        default=KitOptions.batch_tolerance,
        help="max log-prob difference between batchings of the same rows (default %(default)g)",
    )
    parser.add_argument("--check", action="append", choices=sorted(CHECKS), help="run only this check (repeatable)")
    parser.add_argument(
        "overrides", nargs="*", help="verl/Hydra overrides, e.g. actor_rollout_ref.model.path=/models/x"
    )
    args = parser.parse_args(argv)
    options = KitOptions(alignment_tolerance=args.alignment_tolerance, batch_tolerance=args.batch_tolerance,
                         checks=args.check)  # fmt: skip
    config = kit_config(args.backend, args.overrides)
    report = run_conformance(args.backend, config, options)
    print(report.text(), flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
