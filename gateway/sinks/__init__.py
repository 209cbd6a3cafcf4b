"""Where a query's results go besides live HTTP clients: result sinks declared per query (MQTT
retained last values, HTTP webhooks, NDJSON/Parquet files; `manager.SinkManager`), and the ring
of recent rows that lets a client reconnect without losing any (`ring.ReplayRing`).

Nothing is imported here: `gateway.results` uses the ring, and the sinks use `gateway.results`.
"""
