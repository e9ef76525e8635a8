"""Usage kept across restarts: every finished request's tokens and timings, summed per
minute by route, host, model and key, written to SQLite in batches off the reactor's
thread and read back for ``/_crossbar/usage`` and the status page."""
