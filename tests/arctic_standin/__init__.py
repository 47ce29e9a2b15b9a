"""Arctic RL's own server code on CPU, with only its GPU engines replaced (tests only).

``server``: runs arctic-platform's ``http_server.main()`` with the substitutions;
``cpu_worker`` / ``cpu_engine``: Arctic's ``DeepSpeedWorker`` on a CPU DeepSpeed-engine double;
``cpu_sampler``: the vLLM replica pool double; ``harness``: start it, build configs and batches.
See ``README.md`` for every substitution.
"""
