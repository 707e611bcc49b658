"""The one exception type trajscope raises for bad input.

A :class:`TrajscopeError` carries a single sentence a person can act on (what is
wrong and what to do instead). The CLI and the app show that sentence instead of
a traceback; programmatic users can catch it as a ``ValueError``. When it wraps
another library's error, it quotes :func:`first_sentence` of it and chains it
(``raise TrajscopeError(...) from exc``).
"""


class TrajscopeError(ValueError):
    """Bad input or an unusable resource, explained in one sentence."""


def first_sentence(exc: BaseException, limit: int = 160) -> str:
    """The first sentence of another library's error message, to quote inside a :class:`TrajscopeError`
    (its further lines and advice are cut; the exception itself stays chained as the cause)."""
    lines = str(exc).strip().splitlines()
    return lines[0].split(". ")[0].rstrip(".")[:limit] if lines else type(exc).__name__
