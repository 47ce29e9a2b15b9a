"""Speed benchmarks of verl-remote-backend: every row compares two things measured in the same run.

Run them all with ``python -m benchmarks.run [--quick]`` from the repository root
(see ``benchmarks/README.md``).
"""
