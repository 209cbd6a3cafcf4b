"""The device side: the mote wire protocol, transports and simulated motes.

- :mod:`sensors.protocol`: message structs, ``encode_message`` / ``decode_message`` (sans-IO).
- :mod:`sensors.framing`: COBS + CRC16 serial frames, ``FrameDecoder.feed`` (sans-IO).
- :mod:`sensors.plain_decoder`: plain MQTT devices' JSON or msgpack documents as readings
  (sans-IO).
- :mod:`sensors.transports`: gateway-side ``Transport`` (``messages()``, ``send()``) over MQTT,
  serial and in-process, and the device-side ``MoteLink`` each offers its motes; every MQTT
  client connects with one ``BrokerSettings`` (:mod:`sensors.transports.broker`).
- :mod:`sensors.motes`: simulated motes running firmware_sim programs; a traffic loop pair, the
  METR-LA replay fleet, fault injection.
- :mod:`sensors.reconstruct`: vehicle speed and length from a loop pair's events.
- :mod:`sensors.cli`: ``fjords-gateway simulate-motes``.
"""
