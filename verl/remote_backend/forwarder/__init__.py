"""The CPU forwarder worker that stands in for verl's actor/ref workers, and what it does to each
call: dispatch, output checks, metrics, MFU and step timing."""
