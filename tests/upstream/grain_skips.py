"""The one list of Grain 0.2.18 tests that the upstream runner deselects, each with its reason.

A test is listed only when it checks a private of Grain's (named in the reason) or needs
something out of gristmill's scope. Patterns are fnmatch patterns over pytest node ids,
relative to ``grain/_src/python``.
"""

SKIPS: dict[str, str] = {}
