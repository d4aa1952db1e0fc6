"""The one exception type users see: a sentence saying what was wrong and what to do."""


class TvmfuseError(Exception):
    """An error caused by the user's input or environment, reported as one line by the CLI."""
