"""Comparing two runs: pair kernels, executors, SQL matching, verdicts. It reads the lake and
returns tables; the files of an output folder are rlprobe.report's, written by
rlprobe.pipeline.compare_command; `rlprobe.compare(a, b, out)` (rlprobe/__init__.py) runs a whole
comparison through it.
"""
