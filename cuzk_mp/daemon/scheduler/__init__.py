"""The daemon's job layer: the job table (idempotency, waiting, cancel, retention, journal).

Ordering itself (priority, then submit order, then partition index) is the engine's single
queue; this package decides what reaches it and keeps what comes back.
"""
