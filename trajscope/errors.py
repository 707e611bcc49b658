"""The one exception type trajscope raises for bad input.

A :class:`TrajscopeError` carries a single sentence a person can act on (what is
wrong and what to do instead). The CLI and the app show that sentence instead of
a traceback; programmatic users can catch it as a ``ValueError``.
"""


class TrajscopeError(ValueError):
    """Bad input or an unusable resource, explained in one sentence."""
