"""Exit codes of the rlprobe commands (README, "Exit codes"), defined once."""

EXIT_OK = 0
EXIT_DIVERGED = 1  # rlprobe compare --fail-on-diff: the runs differ
EXIT_GATE_FAILED = 1  # rlprobe pipeline run: a gate returned rows
EXIT_USAGE = 2  # a bad option or value
EXIT_SPEC = 2  # a bad pipeline spec or a failing user query
EXIT_UNREADABLE = 3  # a run that cannot be read, an output that cannot be written
