"""Errors of the core, each naming what is wrong and what to do."""


class DBLogError(Exception):
    """Base of every error this project raises on purpose."""


class InvalidRequest(DBLogError, ValueError):
    """A dump request, key list or parameter that cannot be carried out as given."""
