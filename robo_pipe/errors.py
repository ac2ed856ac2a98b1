"""The one base for every error a user can cause.

A :class:`RoboPipeError` is a mistake in the input (a config field, a path, a model URI, a
target, a dataset or bundle that is corrupt or tampered with, a cluster that does not answer):
the CLI prints its message (which names the file, field or value) and exits 2, with no
traceback. Any other exception is a bug in robo-pipe and shows its traceback (exit 1).

Subclasses keep a builtin base too (``ValueError`` for bad values, ``RuntimeError`` for a
failed run) so that code that catches those, e.g. pydantic validators, keeps working.
"""

from __future__ import annotations


class RoboPipeError(Exception):
    """An error the user can fix: the message names the input and what is wrong with it."""


class InputError(RoboPipeError, ValueError):
    """A path or value given to a command cannot be used (e.g. an output path that is a file)."""
