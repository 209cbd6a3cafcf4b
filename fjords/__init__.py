"""The Fjords query runtime: operators as state machines, push and pull queues, one scheduler.

Sensor proxies push tuples into a shared stream; every continuous query over that stream is
folded into one running plan (the Fjord), so each sample is allocated once and all simple
predicates are evaluated together through a predicate index.
"""
