"""Mote firmware programs, the Atmel-style energy cost model and the `fjords-power` CLI."""
