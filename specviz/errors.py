"""Errors whose message is meant for the person who caused them."""
from __future__ import annotations


class RequestError(ValueError):
    """Bad input, with a message meant for the person who typed it."""


class ModelError(Exception):
    """A message a visitor understands (one line, names the missing package/path/id)."""
