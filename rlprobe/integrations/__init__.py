"""Integrations of rlprobe with training frameworks, one module each (`rlprobe.integrations.trl`).

An integration uses only rlprobe's public API (`rlprobe.from_config`, the probe's `save`,
`save_config`, `log_metrics`, `monitor_grads`, `stage`, `step`, `close`), so it sits on top of
the capture layer and nothing below it knows the framework. Importing this package imports
no framework; each module imports its own when first used.
"""
