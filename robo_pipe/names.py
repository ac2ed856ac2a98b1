"""Names users type (config names, model names) as every backend accepts them.

Prefect artifact keys allow only lowercase letters, digits and dashes; file names and MLflow
experiment paths are happiest with the same. A config may be called ``Demo.v2 arm`` or
``Greifer Ärm``: :func:`slug` is the one place such a name is turned into a key or a file name
(python-slugify: transliterated to ASCII, lowercased, runs of anything else become one dash).
"""

from __future__ import annotations

from slugify import slugify


def slug(name: str) -> str:
    """``name`` as a key and file name: ``"Demo.v2 arm"`` -> ``"demo-v2-arm"``,
    ``"Greifer Ärm"`` -> ``"greifer-arm"``. Empty if ``name`` has no letter or digit."""
    return str(slugify(name))
