"""The device side: the mote wire protocol, transports and simulated motes."""
