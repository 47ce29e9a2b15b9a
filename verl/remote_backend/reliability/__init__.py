"""Every backend call under a time limit, a liveness watchdog and a retry policy, and the server
processes a backend starts itself."""
