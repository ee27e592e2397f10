"""Pipeline YAML's pydantic models (what a spec may hold) and the loaded pipeline; loading,
${VAR} expansion, overrides and error messages are in spec.py."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from rlprobe.errors import EXIT_SPEC, ProbeError
from rlprobe.selection import parse_int_set, parse_key_list


IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]*$"
# tables the runner creates; a query or gate may not take one of these names
BUILTIN_TABLES = ("key_data", "key_rollup", "step_rollup", "grads", "grad_steps", "modules", "scalars",
                  "stats_a", "stats_b", "history", "params", "config_diff")


class SpecError(ProbeError):
    """A pipeline that cannot run as written; `exit_code` 2 (spec) or 3 (a run that cannot be read)."""

    def __init__(self, message: str, exit_code: int = EXIT_SPEC):
        super().__init__(message)
        self.exit_code = exit_code


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)


IntSet = Union[str, int, list[Union[int, str]], None]


class Select(_Strict):
    steps: IntSet = None
    ranks: IntSet = None
    keys: Union[str, list[str], None] = None

    @field_validator("steps", "ranks")
    @classmethod
    def _int_set(cls, value: Any, info) -> Any:
        parse_int_set(value, info.field_name)  # raises ValueError with the expected form
        return value

    def step_list(self) -> list[int] | None:
        return parse_int_set(self.steps, "steps")

    def rank_list(self) -> list[int] | None:
        return parse_int_set(self.ranks, "ranks")

    def key_list(self) -> list[str] | None:
        return parse_key_list(self.keys)


class Executor(_Strict):
    kind: Literal["local", "ray"] = "local"
    workers: int = Field(2, ge=1, le=256)
    address: str | None = None  # ray only: "auto" joins a running cluster, else ray://host:port


class ToleranceRule(_Strict):
    """rtol and/or atol of a key family or a key (docs/across-devices.md, "Tolerances")."""
    rtol: float | None = Field(None, ge=0, allow_inf_nan=False)
    atol: float | None = Field(None, ge=0, allow_inf_nan=False)


class KeyDataTolerance(_Strict):
    """compare.key_data.tolerance: over the dtypes' defaults (rlprobe/comparison/tolerance.py)."""
    rtol: float | None = Field(None, ge=0, allow_inf_nan=False)
    atol: float | None = Field(None, ge=0, allow_inf_nan=False)
    stats_rtol: float | None = Field(None, ge=0, allow_inf_nan=False)
    families: dict[str, ToleranceRule] = {}
    keys: dict[str, ToleranceRule] = {}

    @field_validator("families")
    @classmethod
    def _known_families(cls, value: dict[str, ToleranceRule]) -> dict[str, ToleranceRule]:
        from rlprobe.comparison.tolerance import FAMILIES

        unknown = sorted(set(value) - set(FAMILIES))
        if unknown:
            raise ValueError(f"unknown key family {', '.join(unknown)}; the families are {', '.join(FAMILIES)}")
        return value


class KeyDataCompare(_Strict):
    stats_rtol: float | None = Field(None, ge=0, allow_inf_nan=False)  # an alias of tolerance.stats_rtol
    tolerance: KeyDataTolerance = KeyDataTolerance()
    order: list[str] | None = None

    def tolerance_rules(self) -> Any:
        """The comparison's Tolerance (rlprobe/comparison/tolerance.py) of this section."""
        from rlprobe.comparison.tolerance import Tolerance

        rules = self.tolerance.model_dump(exclude_none=True)
        if self.stats_rtol is not None and "stats_rtol" not in rules:
            rules["stats_rtol"] = self.stats_rtol
        return Tolerance.of(rules, "compare.key_data.tolerance")


class GradsCompare(_Strict):
    """compare_grads' thresholds (docs/grads.md, "Comparison"); the defaults are compare.grads.DEFAULTS."""
    first_step_min: float = Field(0.97, ge=0, le=1)
    max_drop: float = Field(0.03, ge=0, le=1)
    norm_rtol: float = Field(1e-3, ge=0)
    layout_similarity_min: float = Field(0.99, ge=0, le=1)  # the first step's bar when the layouts differ


class ModulesCompare(_Strict):
    stage: str | None = None


class ConfigCompare(_Strict):
    """The config diff (docs/compare.md): `ignore` globs add to the default ignore list."""
    ignore: list[str] = []
    ignore_defaults: bool = True


class Compare(_Strict):
    key_data: KeyDataCompare = KeyDataCompare()
    config: ConfigCompare = ConfigCompare()
    grads: GradsCompare | None = None
    modules: ModulesCompare | None = None


class InlineQuery(_Strict):
    name: str = Field(pattern=IDENTIFIER)
    sql: str


class Gate(_Strict):
    name: str = Field(pattern=IDENTIFIER)
    sql: str  # a .sql file (beside the YAML, else bundled) or the query itself
    description: str = ""


class Report(_Strict):
    xlsx: bool = True
    csv: bool = True
    markdown: bool = True
    junit: bool = True
    plots: bool = False
    plot_every_param: bool = False  # also one PNG per gradient parameter (implies plots)
    lang: Literal["en", "zh"] = "en"


Scalar = Union[bool, int, float, str]


class CheckStage(_Strict):
    """`check:`: rlprobe check on each run (docs/check.md); params as `rlprobe check --param`."""

    params: dict[str, Scalar] = {}
    plots: bool = True


def _flow_key(canonical: str) -> str:
    """A key_map value: a key of the data flow (checked per entry, so an error names its line)."""
    from rlprobe.comparison.key_aliases import flow_key

    try:
        return flow_key(canonical.strip())
    except ProbeError as e:
        raise ValueError(str(e)) from None


FlowKey = Annotated[str, AfterValidator(_flow_key)]


# the reserved name of a pipeline's third run: a control run (comparison/control_run.py)
CONTROL_RUN = "control"


class PipelineSpec(_Strict):
    version: Literal[1]
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    check: CheckStage | None = None  # before runs: their validator reads it
    runs: dict[str, str]
    output: str
    select: Select = Select()
    executor: Executor = Executor()
    compare: Compare = Compare()
    queries: list[Union[str, InlineQuery]] = []
    gates: list[Gate] = []
    params: dict[str, Scalar] = {}
    report: Report = Report()
    history: str | None = None
    key_map: dict[str, FlowKey] = {}  # saved key -> canonical key (docs/compare.md, "Key names")

    @field_validator("key_map")
    @classmethod
    def _key_map(cls, key_map: dict[str, str]) -> dict[str, str]:  # each value is a FlowKey already
        from rlprobe.comparison.key_aliases import parse_key_map

        try:
            return parse_key_map(key_map, "key_map:")
        except ProbeError as e:
            raise ValueError(str(e)) from None

    @field_validator("runs")
    @classmethod
    def _two_runs(cls, runs: dict[str, str], info) -> dict[str, str]:
        compared = [name for name in runs if name != CONTROL_RUN]
        if len(runs) == 3 and CONTROL_RUN not in runs:
            raise ValueError(f"three runs need one named {CONTROL_RUN!r}, the control run (docs/across-devices.md, 'A "
                             f"control run'), e.g. {{baseline: ./a, candidate: ./b, {CONTROL_RUN}: ./c}}; "
                             f"got {', '.join(runs)}")
        if len(runs) == 3 and len(compared) == 2:
            pass  # baseline, candidate and the control run
        elif len(runs) != 2 and not (len(runs) == 1 and info.data.get("check") is not None):
            raise ValueError(f"give exactly two runs, the baseline (A) first, e.g. {{baseline: ./a, candidate: "
                             f"./b}}, and optionally a third named {CONTROL_RUN!r} (a control run); got {len(runs)} "
                             f"(one run is for a check only: add `check: {{}}`)")
        for name in runs:
            if not re.match(IDENTIFIER, name):
                raise ValueError(f"run name {name!r} must be a SQL identifier (letters, digits, _)")
        return runs

    @field_validator("params")
    @classmethod
    def _param_names(cls, params: dict[str, Any]) -> dict[str, Any]:
        declared = default_params()
        for name, value in params.items():
            if not re.match(IDENTIFIER, name):
                raise ValueError(f"parameter name {name!r} must be a SQL identifier (letters, digits, _)")
            default = declared.get(name)
            # a bundled gate compares it as its default's type: NaN passed a gate, a text or true failed its SQL
            if _is_number(default) and not (_is_number(value) and value == value):
                raise ValueError(f"parameter {name}: {value!r} is not a number; the bundled gates compare it as one "
                                 f"(default {default})")
            if isinstance(default, str) and not isinstance(value, str):
                raise ValueError(f"parameter {name}: {value!r} is not a text; the bundled gates read it as one "
                                 f"(default {default!r})")
        return params


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def default_params() -> dict[str, Any]:
    """The parameters the bundled gates read with getvariable(), with the defaults each gate states
    in its header (`-- param NAME = VALUE : meaning`); a pipeline's `params:` overrides them."""
    from rlprobe.lake.sql_runner import declared_params
    from rlprobe.lake.sql_runner import resource_dir

    found: dict[str, Any] = {}
    for gate in sorted((resource_dir("sql") / "gates").glob("*.sql")):
        found.update(declared_params(gate.read_text(encoding="utf-8")))
    return found


@dataclass
class NamedSql:
    """A query or gate ready to run: its table name, SQL text and where it came from."""

    name: str
    sql: str
    origin: str
    description: str = ""


@dataclass
class Pipeline:
    """A validated pipeline with every path resolved."""

    spec: PipelineSpec
    path: Path
    runs: dict[str, Path]
    output: Path
    history: Path | None
    queries: list[NamedSql] = field(default_factory=list)
    gates: list[NamedSql] = field(default_factory=list)

    @property
    def compared(self) -> dict[str, Path]:
        """The runs compared, the baseline (A) first: every run but the control run."""
        return {name: path for name, path in self.runs.items() if not (len(self.runs) == 3 and name == CONTROL_RUN)}

    @property
    def control(self) -> Path | None:
        """The control run's path (runs.control of three runs), or None."""
        return self.runs.get(CONTROL_RUN) if len(self.runs) == 3 else None


# -- loading ---------------------------------------------------------------------------------
