"""Talking to engines: the relay client, health probes, metric parsing, the engine table,
the GPU catalog and the emulated engines. Knows nothing of routing."""
