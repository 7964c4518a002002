"""The base of every error a user can act on.

A `CoralError` says what is wrong with what the user asked for or gave (a file, an option, a
plan, a name) and how to fix it: the CLI prints its message and exits with status 2, without a
traceback. Any other exception that escapes a command is a bug in Coral and shows as one, with
its traceback.

Errors that were `ValueError`s stay `ValueError`s too (`class XError(CoralError,
ValueError)`), so that callers catching the old base keep working.
"""

from __future__ import annotations


class CoralError(Exception):
    """An error in the user's input or request; its message names the problem and the fix."""


class InputError(CoralError, ValueError):
    """A value the user gave (an option, a name, a number) that Coral cannot use: out of range,
    unknown, or at odds with another one. Errors about one kind of input (a scenario file, a
    plan file, a template library) have their own subclasses of `CoralError`."""
