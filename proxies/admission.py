"""How many new sensor ids each source may introduce (sans-IO): a token bucket per source.

Without keys anyone who reaches the broker can make up ids; 50,000 made-up ids in a few
seconds must not cost the gateway its catalog, its log or its real sensors' data. Each source
(the transport a message came through: one MQTT session, one serial port, the in-process hub;
an MQTT subscriber cannot see which client published a message, so a broker is one source)
may introduce `per_minute` ids a minute, in bursts of as many; an id past that is refused
before the catalog or discovery see it (the caller counts and logs it). During start-up
(`startup_s` from the first look) a source may introduce `startup` more ids by their hellos: a gateway that
restarts hears every sensor's retained hello together (hellos only: data of made-up ids
gets no such allowance).

Known ids cost nothing here: only the first message of an id the gateway holds nothing for
takes a token.
"""

from __future__ import annotations

__all__ = ["NewIdLimit", "TokenBucket"]


class TokenBucket:
    """`rate` tokens a second, at most `capacity` (it starts full)."""

    __slots__ = ("rate", "capacity", "tokens", "at")

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        self.rate = rate
        self.capacity = capacity
        self.tokens = capacity
        self.at = now

    def take(self, now: float) -> bool:
        """One token now, if there is one."""
        if now > self.at:
            self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
            self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class NewIdLimit:
    """See the module docstring. `now`: the caller's wall clock (monotonic seconds)."""

    def __init__(self, per_minute: float, *, startup: int = 0, startup_s: float = 30.0) -> None:
        if not per_minute > 0:
            raise ValueError("per_minute must be > 0")
        self.per_minute = per_minute
        self.startup = startup
        self.startup_s = startup_s
        self.refused = 0
        self._buckets: dict[str, TokenBucket] = {}
        self._startup_left: dict[str, int] = {}
        self._started: float | None = None

    def admit(self, source: str, now: float, *, hello: bool = False) -> bool:
        """Whether `source` may introduce one more new id now (False is counted); `hello`:
        the id's first message is a hello, which start-up's allowance admits too."""
        if self._started is None:
            self._started = now
        bucket = self._buckets.get(source)
        if bucket is None:
            bucket = self._buckets[source] = TokenBucket(
                self.per_minute / 60.0, self.per_minute, now
            )
        if bucket.take(now):
            return True
        if hello and now - self._started <= self.startup_s:
            left = self._startup_left.get(source, self.startup)
            if left > 0:
                self._startup_left[source] = left - 1
                return True
        self.refused += 1
        return False
