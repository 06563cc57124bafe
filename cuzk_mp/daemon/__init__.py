"""The proving daemon: configuration, wire protocol, server, job journal, status and client.

``cuzk-mp daemon --config FILE`` runs :class:`cuzk_mp.daemon.server.Daemon` around one
:class:`cuzk_mp.pipeline.engine.Engine`; ``cuzk_mp.daemon.client`` talks to it. Modules:
``config`` (TOML -> EngineConfig/CircuitSpec), ``budget`` (the [memory] split and the pipeline's
shape), ``transport`` (frames, sockets), ``protocol`` (msgspec messages), ``server`` (lifecycle,
handlers), ``jobs`` and ``job_records`` (the job table: request ids, waiters, retention),
``journal`` (SQLite), ``status`` / ``status_http`` / ``metrics`` (observability), ``ops``
(logging, sd_notify), ``client``, ``cli``.
"""
