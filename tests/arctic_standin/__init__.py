"""Arctic RL's own server code on CPU, with only its GPU engines replaced (tests only).

``server``: runs arctic-platform's ``http_server.main()`` with the substitutions;
``cpu_worker``: Arctic's ``DeepSpeedWorker`` with its real ``initialize`` on DeepSpeed's CPU engine;
``zorro_double``: ZoRRo Train's patched forward; ``engine_probe``: worker jobs without the server;
``cpu_sampler``: the vLLM replica pool double; ``harness``: start it, build configs and batches.
See ``README.md`` for every substitution.
"""
