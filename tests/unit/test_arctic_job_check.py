"""The arctic adapter's check that the server still holds this run's jobs (``server_http.jobs_problem``),
on answers shaped like Arctic's ``GET /status`` (JSON: job ids become string keys).

A restarted Arctic server numbers its jobs from 1 again and exposes no boot id: the check must tell
our jobs from a fresh server's, including one that reuses our ids for another client's jobs.
The same check against a real restarted stand-in: tests/faults/test_arctic_wire_faults.py.
"""

from __future__ import annotations

import os

from verl.workers.remote_client.arctic.server_http import jobs_problem

ROOT = "/ckpt/run-a"
JOBS = {"training": 1, "sampling": 2, "log_prob": None}


def status(*jobs: tuple[int, str, str | None]) -> dict:
    held = {}
    for job_id, job_type, root in jobs:
        info = {"job_id": job_id, "job_type": job_type, "status": "RUNNING", "checkpoint_path": None}
        if job_type == "training":
            info["checkpoint_path"] = os.path.join(root, f"arctic_rl_job_{job_id}")
        held[str(job_id)] = info
    return {"training_gpus": 1, "sampling_gpus": 1, "log_prob_gpus": 0, "jobs": held}


def test_the_servers_own_jobs_pass():
    assert jobs_problem(status((1, "training", ROOT), (2, "sampling", None)), JOBS, ROOT) is None


def test_a_fresh_server_without_jobs_is_named_job_by_job():
    problem = jobs_problem(status(), JOBS, ROOT)
    assert problem == "training job 1 is gone; sampling job 2 is gone"


def test_our_ids_reused_by_another_runs_training_job_are_refused():
    other = "/ckpt/run-b"
    problem = jobs_problem(status((1, "training", other), (2, "sampling", None)), JOBS, ROOT)
    assert problem is not None and "training job 1 belongs to another run" in problem and other in problem


def test_an_id_reused_for_another_job_type_is_refused():
    problem = jobs_problem(status((1, "sampling", None), (2, "training", ROOT)), JOBS, ROOT)
    assert problem is not None
    assert "job 1 is now a sampling job, not this run's training job" in problem
    assert "job 2 is now a training job, not this run's sampling job" in problem


def test_an_answer_without_a_job_list_is_a_problem():
    assert "lists no jobs" in jobs_problem({"detail": "Not Found"}, JOBS, ROOT)
