"""The one exception type users see (a sentence saying what was wrong and what to do), and the
one way a foreign error (TVM's, torch's) is cut down to the line that says what failed."""

import re


class TvmfuseError(Exception):
    """An error caused by the user's input or environment, reported as one line by the CLI."""


class CompileError(TvmfuseError):
    """A pipeline phase failed on the model: the message names the phase and what TVM said."""


#: Lines of TVM's error texts that say nothing about the error.
_NOISE = re.compile(r"#\s*Metadata omitted|^\s*$|^\s*\^+\s*$|^Traceback|^\s*File \"|^\s*\d+: ")
#: A line that states an error: "TVMError: ...", "ValueError: ...", "Check failed: ...".
_STATEMENT = re.compile(r"^\s*([\w.]*(Error|Exception)\b:?|Check failed\b)")


def one_line(err: BaseException, limit: int = 300) -> str:
    """The line of ``err``'s text that says what went wrong, for a one-line report.

    TVM's errors end in the statement after a C++ backtrace or a printed module (whose last line
    may be "# Metadata omitted ..."); Python's start with it. The last line that reads as an
    error statement wins, else the first meaningful line. An op's whole repr (TVM prefixes
    type-check errors with it) is shortened to its name.
    """
    text = str(err).strip() or type(err).__name__
    text = re.sub(r'ir\.Op\(.*?name="([^"]+)".*?support_level=\d+\)', r"\1", text, flags=re.S)
    lines = [line.strip() for line in text.splitlines() if not _NOISE.search(line)]
    statements = [line for line in lines if _STATEMENT.match(line)]
    chosen = statements[-1] if statements else lines[0] if lines else type(err).__name__
    return chosen[:limit]
