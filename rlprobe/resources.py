"""Find the bundled sql/, pipelines/ and examples/ folders, installed or in a checkout."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

BUNDLED = ("sql", "pipelines", "examples")


def resource_dir(name: str) -> Path:
    """Path of a bundled top-level folder: inside the wheel, else the source checkout."""
    if name not in BUNDLED:
        raise ValueError(f"unknown resource folder {name!r}; expected one of {BUNDLED}")
    installed = resources.files("rlprobe") / "_bundled" / name
    if installed.is_dir():
        return Path(str(installed))
    checkout = Path(__file__).resolve().parent.parent / name
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(f"rlprobe's {name}/ folder is missing from this installation ({installed})")


def sql_text(name: str) -> str:
    """The text of a bundled SQL file, e.g. sql_text('info_key_data.sql')."""
    return (resource_dir("sql") / name).read_text(encoding="utf-8")
