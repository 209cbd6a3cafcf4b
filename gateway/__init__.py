"""The edge daemon: configuration, HTTP API, MQTT bridge, persistence and Spark jobs."""
