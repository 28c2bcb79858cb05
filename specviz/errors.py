"""Errors whose message is meant for the person who caused them."""
from __future__ import annotations


class RequestError(ValueError):
    """Bad input, with a message meant for the person who typed it."""
