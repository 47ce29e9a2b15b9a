"""The suite's fault ledger: every fault a test injects, and how it ended.

``tests/faults/conftest.py`` records into :data:`LEDGER` (its ``fault`` fixture); the suite's root
conftest prints it at the end. Under pytest-xdist each worker holds its own ledger, hands it to
the controller as a plain dict (:meth:`Ledger.as_dict`, ``workeroutput``) and the controller adds
them up (:meth:`Ledger.add`), so the summary counts every worker's faults.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Ledger:
    """Counts of injected faults; ``cases`` holds ``(test, verdict, seconds)`` per fault."""

    injected: int = 0
    surfaced: int = 0
    hangs: int = 0
    checkpoints_lost: int = 0
    cases: list = field(default_factory=list)

    def line(self) -> str:
        return (
            f"faults injected: {self.injected} / surfaced correctly: {self.surfaced} / hangs: {self.hangs} / "
            f"checkpoints lost: {self.checkpoints_lost}"
        )

    def as_dict(self) -> dict[str, Any]:
        """This ledger as plain values (what xdist can send from a worker to the controller)."""
        return asdict(self)

    def add(self, other: dict[str, Any]) -> None:
        """Add another ledger's :meth:`as_dict` to this one."""
        self.injected += other["injected"]
        self.surfaced += other["surfaced"]
        self.hangs += other["hangs"]
        self.checkpoints_lost += other["checkpoints_lost"]
        self.cases.extend(tuple(case) for case in other["cases"])


#: this process's ledger (a worker's own, or the controller's sum of them)
LEDGER = Ledger()
