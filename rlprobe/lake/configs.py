"""The training configs a dump holds (Probe.save_config): configurations.json (rank 0) and
configurations.rank<R>.json, as dicts and as rows for SQL."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa

from rlprobe.errors import DumpReadError
from rlprobe.lake.layout import FORMAT_VERSION
from rlprobe.lake.regular_files import JSON_FILE, read_text

CONFIG_SCHEMA = pa.schema([("rank", pa.int64()), ("path", pa.string()), ("value", pa.string())])
_CONFIG_NAME = re.compile(r"configurations(?:\.rank(\d+))?\.json")


def read_configs(root: Path, errors: list[str] | None = None) -> dict[int, dict[str, Any]]:
    """Config per rank of the dump at `root`. Other configurations*.json files are not rlprobe's
    and are left out (with `errors` given, described there, as is an unreadable one instead of
    raising DumpReadError)."""
    found = {}
    for f in sorted(Path(root).glob("configurations*.json")):
        m = _CONFIG_NAME.fullmatch(f.name)
        if m is None:
            if errors is not None:
                errors.append(f"{f}: not a config file rlprobe writes (configurations.json or "
                              "configurations.rank<R>.json); left out of configs")
            continue
        try:
            found[int(m.group(1) or 0)] = read_json(f)
        except DumpReadError as e:
            if errors is None:
                raise
            errors.append(f"{e}; left out of configs")
    return dict(sorted(found.items()))


def configs_as_table(configs: dict[int, dict[str, Any]]) -> pa.Table:
    rows = [{"rank": r, "path": p, "value": json.dumps(v)}
            for r, cfg in configs.items() for p, v in config_leaves(cfg)]
    return pa.Table.from_pylist(rows, schema=CONFIG_SCHEMA)


def read_json(path: Path, versioned: bool = False) -> dict[str, Any]:
    """A JSON object of the dump ({} when the file is missing); DumpReadError naming it when unreadable (a FIFO
    or a device too: never read, lake/regular_files.py) or not an object. `versioned` (a manifest): also when its
    format_version is not the one this rlprobe reads (a newer rlprobe's dump was read as this format)."""
    try:
        value = json.loads(read_text(path, JSON_FILE))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:  # an OSError's strerror: the problem without the path again
        raise DumpReadError(f"{path}: unreadable JSON ({getattr(e, 'strerror', None) or e})") from None
    if not isinstance(value, dict):
        raise DumpReadError(f"{path}: expected a JSON object ({{...}}), found a JSON {type(value).__name__}")
    version = value.get("format_version", FORMAT_VERSION) if versioned else FORMAT_VERSION
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise DumpReadError(f"{path}: format_version {version!r}, where this rlprobe reads dumps of format "
                            f"{FORMAT_VERSION} (a dump written by a newer rlprobe: read it with that version)")
    return value


def config_leaves(obj: Any, prefix: str = ""):
    """(dotted path, value) of every leaf of a nested config dict; an empty dict is a leaf."""
    if isinstance(obj, dict) and obj:
        for k, v in obj.items():
            yield from config_leaves(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, obj


def value_text(value: str | None, limit: int = 80) -> str:
    """A config value (JSON text) as the reports show it; '(absent)' where the run has no such path."""
    if value is None:
        return "(absent)"
    try:
        text = json.dumps(json.loads(value), ensure_ascii=False)
    except ValueError:
        text = value
    return text if len(text) <= limit else text[:limit - 1] + "…"
