"""The fault-injection suite (issue 7): every fault ends in a clear error, quickly, with nothing saved lost."""
