"""dam_probe: the in-process training probe (standard library only).

``instrument(iterable)`` wraps a DataLoader (or any iterable) and publishes
cumulative counters to ``$DAM_PROBE_DIR/probe-<pid>.bin`` (see ``layout``).
"""
