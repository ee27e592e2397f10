"""Comparing two runs: pair kernels, executors, SQL matching, verdicts. It reads the lake and
returns tables; the files of an output folder are rlprobe.report's, written by
rlprobe.pipeline.compare_command.

The package itself is callable (set up by rlprobe/__init__.py, which orchestrates), so
`rlprobe.compare(a, b, out)` runs a whole comparison, writes its output folder and returns its
summary (see rlprobe.pipeline.compare_command.compare for the options).
"""
