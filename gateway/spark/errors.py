"""The error of a valid query that Spark cannot run (the Fjord can)."""

from __future__ import annotations

from fjords.errors import ClauseError


class SparkUnsupportedError(ClauseError):
    """A valid query that Spark cannot run; the message names the construct (and where it is,
    when the construct has a position)."""
