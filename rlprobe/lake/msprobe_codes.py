"""The codes of rlprobe.lake.msprobe_kernels' results, without numba: rlprobe.lake.msprobe_format reads
the compiled reader's columns with them."""

# the run's status: read (0), or left to Python's reading whole
FALLBACK = 1
# a tensor's statistics file: none listed, parsed by the kernel, left to Python's reading of that file
NO_FILE, PARSED, SLOW = 0, 1, 2
# a statistic's value (min, max, mean, norm): null or missing, a number (its text), NaN, Infinity, -Infinity
STAT_NULL, STAT_NUMBER, STAT_NAN, STAT_INF, STAT_NEG_INF = 0, 1, 2, 3, 4
