"""The one exception type users catch."""


class ProbeError(Exception):
    """A bad value, name, path or I/O failure, with what to do about it in the message."""


class DumpReadError(ProbeError):
    """A dump (or a file inside it) that cannot be read."""
