"""Pipeline YAML: pydantic models, loading with line numbers, ${VAR} expansion and --set overrides.

Every error names the file, the line and the field (`nightly.yaml:7: gates[1].sql: ...`), and
says what to do: "did you mean" for unknown keys, the searched paths for a missing SQL file,
the resolved path for a missing run.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import os
import re
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rlprobe.errors import EXIT_UNREADABLE
from rlprobe.pipeline.spec_models import (BUILTIN_TABLES, IDENTIFIER, InlineQuery, NamedSql, Pipeline, PipelineSpec,
                                          SpecError)

# the models are spec_models.py's; these names stay importable from here
__all__ = ["BUILTIN_TABLES", "IDENTIFIER", "NamedSql", "Pipeline", "PipelineSpec", "SpecError", "check_run_dirs",
           "dotted", "load_pipeline"]

def load_pipeline(path: str | os.PathLike[str], overrides: list[str] | tuple[str, ...] = (), *,
                  check_runs: bool = True, env: dict[str, str] | None = None,
                  today: _dt.date | None = None) -> Pipeline:
    """Read, expand, override, validate and resolve a pipeline YAML file; raises SpecError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(f"{path}: cannot read the pipeline file ({e.strerror or e})") from None
    data, lines = _compose(path, text)
    overridden = _apply_overrides(path, data, overrides)
    where = _Where(path, lines, overridden)
    env = dict(os.environ) if env is None else env
    name = data.get("name") if isinstance(data.get("name"), str) else ""
    specials = {"name": name, "date": (today or _dt.date.today()).isoformat()}
    data = _expand(data, (), env, specials, where)
    try:
        spec = PipelineSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(_describe(e, data, where)) from None
    if spec.check is not None:  # its parameters' names and values, as `rlprobe check` takes them
        from rlprobe.checks.registry import check_params

        try:
            check_params(spec.check.params)
        except ValueError as e:
            loc = ("check", "params")
            raise SpecError(f"{where.at(loc)}: {dotted(loc)}: {e}") from None
    base = path.resolve().parent
    # a path written in the file is relative to the file; one given with --set to the current folder
    runs = {n: _resolve(where.base(("runs", n), base), p) for n, p in spec.runs.items()}
    pipeline = Pipeline(spec, path, runs, _resolve(where.base(("output",), base), spec.output),
                        _resolve(where.base(("history",), base), spec.history) if spec.history else None)
    taken: dict[str, str] = {}
    for i, q in enumerate(spec.queries):
        loc = ("queries", i)
        if isinstance(q, InlineQuery):
            item = NamedSql(q.name, q.sql, f"{where.at(loc)} (inline query {q.name})")
        else:
            file = _find_sql(q, base, where, loc)
            item = NamedSql(file.stem, _read_sql(file, where, loc), str(file))
        _claim_name(item.name, taken, where, loc)
        pipeline.queries.append(item)
    for i, g in enumerate(spec.gates):
        loc = ("gates", i, "sql")
        if _looks_like_file(g.sql):
            file = _find_sql(g.sql, base, where, loc)
            item = NamedSql(g.name, _read_sql(file, where, loc), str(file), g.description)
        else:
            item = NamedSql(g.name, g.sql, f"{where.at(loc)} (inline gate {g.name})", g.description)
        _claim_name(item.name, taken, where, ("gates", i, "name"))
        pipeline.gates.append(item)
    if check_runs:
        check_run_dirs(pipeline, where)
    return pipeline


def check_run_dirs(pipeline: Pipeline, where: "_Where | None" = None) -> None:
    """Each run must be a readable dump; otherwise SpecError with exit code 3 and the path."""
    from rlprobe.errors import DumpReadError
    from rlprobe.lake.reader import open_dump

    where = where or _Where(pipeline.path, {}, set())
    for name, run in pipeline.runs.items():
        try:
            open_dump(run)
        except DumpReadError as e:
            given = pipeline.spec.runs[name]
            origin = "" if Path(given).expanduser().is_absolute() else \
                f", relative to {where.base(('runs', name), pipeline.path.resolve().parent)}"
            raise SpecError(f"{where.at(('runs', name))}: runs.{name}: {e} (resolved from {given!r}{origin})",
                            EXIT_UNREADABLE) from None


def _compose(path: Path, text: str) -> tuple[dict[str, Any], dict[tuple, int]]:
    """The YAML's data and the line (1-based) of every node, by path of keys and indexes."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.load(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise SpecError(f"{path}{line}: malformed YAML: {problem}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}:1: the pipeline must be a mapping with version, name, runs, output, ... "
                        f"(got {type(data).__name__})")
    lines: dict[tuple, int] = {}

    def walk(node: yaml.Node, loc: tuple) -> None:
        lines.setdefault(loc, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            seen: dict[tuple[str, str], int] = {}
            for key, value in node.value:
                line = key.start_mark.line + 1
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    if (key.tag, key.value) in seen:  # PyYAML would keep the last one silently
                        raise SpecError(f"{path}:{line}: key '{dotted(loc + (key.value,))}' appears twice "
                                        f"(lines {seen[(key.tag, key.value)]} and {line}); keep one")
                    seen[(key.tag, key.value)] = line
                lines[loc + (key.value,)] = line
                walk(value, loc + (key.value,))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, loc + (i,))

    walk(root, ())
    return data, lines


class _Where:
    """file:line of a field, or the --set option that gave it."""

    def __init__(self, path: Path, lines: dict[tuple, int], overridden: set[tuple]):
        self.path, self.lines, self.overridden = path, lines, overridden

    def base(self, loc: tuple, file_base: Path) -> Path:
        """The folder a relative path at `loc` is resolved against: the current one for a value
        given with --set (a shell argument), the YAML file's folder for one written in it."""
        return Path.cwd() if any(loc[:n] in self.overridden for n in range(1, len(loc) + 1)) else file_base

    def at(self, loc: tuple) -> str:
        for n in range(len(loc), 0, -1):
            if loc[:n] in self.overridden:
                return f"{self.path} (--set {dotted(loc[:n])})"
        for n in range(len(loc), -1, -1):
            if loc[:n] in self.lines:
                return f"{self.path}:{self.lines[loc[:n]]}"
        return str(self.path)


def dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _apply_overrides(path: Path, data: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> set[tuple]:
    done: set[tuple] = set()
    for item in overrides:
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise SpecError(f"--set {item!r}: expected FIELD.PATH=VALUE, e.g. --set runs.candidate=./dumps/b")
        key, raw = item.split("=", 1)
        parts: list[Any] = [int(p) if p.isdigit() else p for p in key.strip().split(".")]
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        node: Any = data
        for i, part in enumerate(parts[:-1]):
            if isinstance(node, dict):
                node = node.setdefault(part, {})
            elif isinstance(node, list) and isinstance(part, int) and part < len(node):
                node = node[part]
            else:
                raise SpecError(f"--set {item!r}: {dotted(tuple(parts[:i + 1]))} is not a mapping or list in {path}")
        last = parts[-1]
        if isinstance(node, dict):
            node[last] = value
        elif isinstance(node, list) and isinstance(last, int) and last < len(node):
            node[last] = value
        else:
            raise SpecError(f"--set {item!r}: cannot set {dotted(tuple(parts))} in {path}")
        done.add(tuple(parts))
    return done


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand(value: Any, loc: tuple, env: dict[str, str], specials: dict[str, str], where: _Where) -> Any:
    """${name}, ${date} and ${ENV_VAR} in every string value; an unset variable is an error."""
    if isinstance(value, dict):
        return {k: _expand(v, loc + (k,), env, specials, where) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, loc + (i,), env, specials, where) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${" not in value or loc[:1] in (("queries",), ("gates",)):
        return value  # SQL text is never expanded: values reach SQL as bound parameters

    def sub(m: re.Match) -> str:
        var = m.group(1)
        if var in specials:
            return specials[var]
        if var in env:
            return env[var]
        raise SpecError(f"{where.at(loc)}: {dotted(loc)}: environment variable ${{{var}}} is not set "
                        f"(export {var}=..., or give the value with --set {dotted(loc)}=...)")

    return _VAR.sub(sub, value)


def _describe(error: ValidationError, data: dict[str, Any], where: _Where) -> str:
    items = []
    for e in error.errors():
        loc = _data_loc(e["loc"], data)
        items.append((loc, e))
    # a union tries every member; keep the most specific complaint about each value
    locs = [loc for loc, _ in items]
    kept, seen = [], set()
    for loc, e in items:
        if any(other != loc and other[:len(loc)] == loc for other in locs):
            continue
        if (loc, e["type"]) in seen:
            continue
        seen.add((loc, e["type"]))
        kept.append((loc, e))
    messages = sorted((_message(loc, e, where) for loc, e in kept), key=_line_of)
    head = f"{where.path}: invalid pipeline ({len(messages)} problem{'s' if len(messages) > 1 else ''})"
    return head + "\n" + "\n".join(f"  {m}" for m in messages)


def _line_of(message: str) -> int:
    m = re.match(r"[^:]*:(\d+):", message)
    return int(m.group(1)) if m else 0


def _data_loc(loc: tuple, data: Any) -> tuple:
    """Pydantic's error location without union member tags: only the keys that are in the data."""
    out: list[Any] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            out.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            out.append(part)
            node = node[part]
        elif isinstance(node, dict) and isinstance(part, str) and not _union_tag(part):
            out.append(part)  # a missing field: name it
            node = None
    return tuple(out)


def _union_tag(part: str) -> bool:
    """Pydantic names the member of a union it tried (str, list[str], InlineQuery); fields are lower_case."""
    return part in ("str", "int", "float", "bool", "none") or "[" in part or part[:1].isupper()


def _message(loc: tuple, e: dict[str, Any], where: _Where) -> str:
    kind = e["type"]
    name = dotted(loc) or "(top level)"
    if kind == "extra_forbidden":
        key = loc[-1]
        allowed = _fields_at(loc[:-1])
        close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return f"{where.at(loc)}: {name}: unknown field '{key}'{hint} (allowed: {', '.join(allowed)})"
    if kind == "missing":
        return f"{where.at(loc[:-1])}: {name}: required field '{loc[-1]}' is missing"
    got = e.get("input")
    shown = "" if isinstance(got, (dict, list)) else f" (got {got!r})"
    msg = e["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return f"{where.at(loc)}: {name}: {msg}{shown}"


def _fields_at(loc: tuple) -> list[str]:
    """Field names of the model found at `loc` (for did-you-mean)."""
    model: Any = PipelineSpec
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        info = model.model_fields.get(part)
        model = _model_in(info.annotation) if info is not None else None
    return list(model.model_fields) if model is not None else []


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _resolve(base: Path, value: str) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else (base / p)


def _looks_like_file(text: str) -> bool:
    return text.strip().lower().endswith(".sql") and not any(c.isspace() for c in text.strip())


def _find_sql(name: str, base: Path, where: _Where, loc: tuple) -> Path:
    """A SQL file beside the YAML, else among the bundled sql/ files."""
    from rlprobe.lake.sql_runner import resource_dir

    if not _looks_like_file(name):
        raise SpecError(f"{where.at(loc)}: {dotted(loc)}: {name!r} is not a .sql file; write an inline query "
                        "as {name: ..., sql: ...}")
    bundled = resource_dir("sql")
    candidates = [base / name, bundled / name]
    if name.startswith("sql/"):
        candidates.append(bundled / name[4:])
    for c in candidates:
        if c.is_file():
            return c
    return _missing_sql(name, candidates, where, loc)


def _missing_sql(name: str, candidates: list[Path], where: _Where, loc: tuple) -> Path:
    from rlprobe.lake.sql_runner import resource_dir

    bundled = sorted(str(p.relative_to(resource_dir("sql"))) for p in resource_dir("sql").rglob("*.sql"))
    close = difflib.get_close_matches(name.removeprefix("sql/"), bundled, n=1, cutoff=0.75)
    hint = f"; did you mean 'sql/{close[0]}'?" if close else ""
    raise SpecError(f"{where.at(loc)}: {dotted(loc)}: SQL file {name!r} not found (looked at "
                    f"{', '.join(str(c) for c in candidates)}){hint}")


def _read_sql(file: Path, where: _Where, loc: tuple) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"{where.at(loc)}: {dotted(loc)}: cannot read {file}: {e}") from None


def _claim_name(name: str, taken: dict[str, str], where: _Where, loc: tuple) -> None:
    if name in BUILTIN_TABLES:
        raise SpecError(f"{where.at(loc)}: {dotted(loc)}: '{name}' is a table the pipeline provides "
                        f"({', '.join(BUILTIN_TABLES)}); choose another name")
    if not re.match(IDENTIFIER, name):
        raise SpecError(f"{where.at(loc)}: {dotted(loc)}: table name '{name}' must be a SQL identifier "
                        "(letters, digits, _); rename the file")
    if name in taken:
        raise SpecError(f"{where.at(loc)}: {dotted(loc)}: '{name}' is already used by {taken[name]}")
    taken[name] = where.at(loc)
