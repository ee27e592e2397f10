"""The exceptions users catch, and the exit codes of the rlprobe commands (README, "Exit codes"), defined once."""


class ProbeError(Exception):
    """A bad value, name, path or I/O failure, with what to do about it in the message."""


class DumpReadError(ProbeError):
    """A dump (or a file inside it) that cannot be read."""


class SelectionError(ProbeError):
    """A selection (keys, steps, ranks) that names a key neither run saved, or that matches none of their
    key data: a usage error (exit code 2), not an unreadable run."""


class UnreadEntriesWarning(UserWarning):
    """Files or folders in a dump that rlprobe does not read (an msprobe dump's entries in no layout msprobe
    writes): named, never an error, since msprobe itself ignores what it does not know."""


class ControlRunError(ProbeError):
    """A control run (`--control`, `runs: {control: ...}`) that cannot serve as one: missing, not a dump, or
    without key data in common with run A (docs/across-devices.md, "A control run")."""


# exit codes of the commands
EXIT_OK = 0
EXIT_DIVERGED = 1  # rlprobe compare --fail-on-diff: the runs differ
EXIT_GATE_FAILED = 1  # rlprobe pipeline run: a gate returned rows
EXIT_USAGE = 2  # a bad option or value
EXIT_SPEC = 2  # a bad pipeline spec or a failing user query
EXIT_UNREADABLE = 3  # a run that cannot be read, an output that cannot be written
