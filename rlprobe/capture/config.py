"""`rlprobe.from_config(cfg)`: the training-config switch (MindSpeed-RL's `msprobe_config` keys accepted as is).

Training code calls `save`, `save_config`, `log_metrics`, `stage`, `monitor_grads`, `monitor_params` and
`step` unconditionally; what each does is decided once, here, by the config. A switch that
is off makes its call a plain method that returns at once (`stage` returns a shared null
context manager), and with nothing switched on no probe is created at all: no files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from rlprobe.capture.stages import NULL_STAGE, STAGES, steps_of
from rlprobe.errors import ProbeError

ACTOR_STAGES = ("actor_compute_log_prob", "actor_update")
REFERENCE_STAGES = ("reference_compute_log_prob",)
KEYS = {
    "enable": bool, "msprobe": bool, "dump_path": str, "key_data_dump": bool, "configurations_dump": bool,
    "actor_train_dump": bool, "reference_dump": bool, "grads_dump": bool, "param_fingerprints": bool,
    "metrics_dump": bool,
    "step_start": int, "step_end": int, "stages": list, "tensors": bool, "mode": str, "flush_interval": float,
    "replay_from": str, "summed_keys": list, "stage_weights": bool,
}


@dataclass(frozen=True)
class ProbeConfig:
    """The switches of one `rlprobe_config` / `msprobe_config` section, validated."""

    enabled: bool = False
    dump_path: str = "./rlprobe_dump"
    key_data_dump: bool = False
    configurations_dump: bool = False
    grads_dump: bool = False
    param_fingerprints: bool = False
    metrics_dump: bool | None = None  # None: follows key_data_dump
    stages: frozenset[str] = field(default_factory=frozenset)
    step_start: int | None = None
    step_end: int | None = None
    tensors: bool = False
    stage_weights: bool = True  # module dumps fingerprint each module's own weights (docs/modules.md)
    mode: str | None = None
    flush_interval: float | None = None  # seconds; None: the Probe's default
    replay_from: str | None = None  # the baseline dump whose rollout this run consumes (docs/replay.md)
    summed_keys: tuple[str, ...] | None = None  # as Probe(summed_keys=); None: the Probe's (or integration's) default

    @property
    def any_switch(self) -> bool:
        return self.enabled and bool(self.key_data_dump or self.configurations_dump or self.grads_dump
                                     or self.param_fingerprints or self.metrics_dump or self.stages)

    def in_steps(self, step: int) -> bool:
        return (self.step_start is None or step >= self.step_start) and (self.step_end is None or step <= self.step_end)


def parse_config(cfg: Any) -> ProbeConfig:
    """A ProbeConfig from a dict, an object with attributes (OmegaConf, dataclass, namespace), YAML text
    or a YAML file."""
    section, name = _section(cfg)
    values = _as_mapping(section, name)
    unknown = sorted(set(values) - set(KEYS))
    if unknown:
        raise ProbeError(f"{name}: unknown key(s) {', '.join(map(repr, unknown))}; known keys: {', '.join(KEYS)}")
    for key, value in values.items():
        want = KEYS[key]
        ok = (isinstance(value, bool) if want is bool else
              isinstance(value, int) and not isinstance(value, bool) if want is int else
              isinstance(value, (int, float)) and not isinstance(value, bool) if want is float else
              isinstance(value, (list, tuple)) if want is list else isinstance(value, (str, os.PathLike)))
        if not ok and not (value is None and key in ("step_start", "step_end", "stages", "flush_interval", "replay_from")):
            raise ProbeError(f"{name}.{key}: expected {want.__name__}, got {type(value).__name__} {value!r}")
    msprobe = name == "msprobe_config"
    # an rlprobe_config section is on unless it says otherwise; MindSpeed-RL's msprobe switch defaults to off
    enabled = bool(values.get("enable", values.get("msprobe", not msprobe)))
    if "enable" in values and "msprobe" in values and values["enable"] != values["msprobe"]:
        raise ProbeError(f"{name}: enable={values['enable']} and msprobe={values['msprobe']} disagree; "
                         "give one of them")
    stages = set()
    for s in values.get("stages") or []:
        if not isinstance(s, str) or not s:
            raise ProbeError(f"{name}.stages: stage names are non-empty strings, got {s!r}; e.g. {list(STAGES[:2])}")
        stages.add(s)
    if values.get("actor_train_dump"):
        stages.update(ACTOR_STAGES)
    if values.get("reference_dump"):
        stages.update(REFERENCE_STAGES)
    start, end = values.get("step_start"), values.get("step_end")
    for key, v in (("step_start", start), ("step_end", end)):
        if v is not None and v < 0:
            raise ProbeError(f"{name}.{key}: expected a step >= 0, got {v}")
    if start is not None and end is not None and end < start:
        raise ProbeError(f"{name}: step_end {end} is before step_start {start}; for one step give both the same value")
    replay_from = values.get("replay_from")
    if replay_from is not None and not os.fspath(replay_from):
        raise ProbeError(f"{name}.replay_from: expected the baseline dump's directory, got an empty string")
    if replay_from is not None and not enabled:
        raise ProbeError(f"{name}.replay_from is set but the section is switched off ({'msprobe' if msprobe else 'enable'}"
                         ": false): the run would sample its own rollout; switch it on or remove replay_from")
    if replay_from is not None and not values.get("key_data_dump"):
        raise ProbeError(f"{name}.replay_from needs key_data_dump: true: replay follows the micro-steps of the saves, "
                         "and this run's key data is what is compared with the baseline's")
    return ProbeConfig(
        enabled=enabled,
        dump_path=str(values.get("dump_path") or ("./msprobe_dump" if msprobe else "./rlprobe_dump")),
        key_data_dump=bool(values.get("key_data_dump", False)),
        configurations_dump=bool(values.get("configurations_dump", False)),
        grads_dump=bool(values.get("grads_dump", False)),
        param_fingerprints=bool(values.get("param_fingerprints", False)),
        metrics_dump=values.get("metrics_dump"),
        stages=frozenset(stages), step_start=start, step_end=end,
        tensors=bool(values.get("tensors", False)), stage_weights=bool(values.get("stage_weights", True)),
        mode=values.get("mode"),
        flush_interval=values.get("flush_interval"),
        replay_from=None if replay_from is None else os.fspath(replay_from),
        summed_keys=None if values.get("summed_keys") is None else tuple(values["summed_keys"]),
    )


def _section(cfg: Any) -> tuple[Any, str]:
    if isinstance(cfg, (str, os.PathLike)):
        cfg = _load_yaml(cfg)
    for name in ("rlprobe_config", "msprobe_config"):
        if isinstance(cfg, Mapping) and name in cfg:
            return cfg[name], name
        if not isinstance(cfg, Mapping) and getattr(cfg, name, None) is not None:
            return getattr(cfg, name), name
    if isinstance(cfg, Mapping) and cfg and set(cfg) <= set(KEYS):
        return cfg, "rlprobe_config"  # the section itself
    if cfg is None or isinstance(cfg, Mapping) or hasattr(cfg, "__dict__") or hasattr(cfg, "items"):
        return {"enable": False}, "rlprobe_config"  # a training config without a probe section: everything off
    raise ProbeError(f"config: expected a dict, an object with attributes or YAML text, got {type(cfg).__name__}; "
                     "e.g. {'rlprobe_config': {'dump_path': './dump', 'key_data_dump': True}}")


def _load_yaml(source: str | os.PathLike[str]) -> Any:
    import yaml

    text = str(source)
    if isinstance(source, os.PathLike) or ("\n" not in text and text.endswith((".yaml", ".yml", ".json"))):
        try:
            with open(source, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise ProbeError(f"cannot read the config file {source}: {e.strerror or e}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ProbeError(f"config is not valid YAML: {e}") from None


def _as_mapping(section: Any, name: str) -> dict[str, Any]:
    if section is None:
        return {}
    if isinstance(section, Mapping):
        return dict(section)
    if hasattr(section, "items") and callable(section.items):  # OmegaConf DictConfig and friends
        return dict(section.items())
    attrs = {k: getattr(section, k) for k in KEYS if hasattr(section, k)}
    if attrs:
        return attrs
    raise ProbeError(f"{name}: expected a mapping or an object with attributes such as dump_path, "
                     f"got {type(section).__name__}")


class DisabledProbe:
    """Accepts every Probe call and does nothing, so training code needs no `if`."""

    enabled = False
    current_step = 0

    def save(self, data: Any, sample_ids: Any = None, group_ids: Any = None) -> None:
        return None

    def save_config(self, config: Any) -> None:
        return None

    def replay(self, data: Any, micro_step: Any = None) -> Any:
        return data  # nothing to replay from: the live values

    def log_metrics(self, metrics: Any, step: Any = None) -> None:
        return None

    def monitor_grads(self, *args: Any, **kwargs: Any) -> None:
        return None

    def monitor_params(self, *args: Any, **kwargs: Any) -> None:
        return None

    def stage(self, name: str, model: Any = None, **kwargs: Any) -> Any:
        return NULL_STAGE

    def step(self) -> None:
        return None

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None

    def __enter__(self) -> "DisabledProbe":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __repr__(self) -> str:
        return "DisabledProbe()"


class ConfiguredProbe:
    """A Probe whose calls follow the config's switches; the ones switched off return at once."""

    enabled = True

    def __init__(self, config: ProbeConfig, probe: Any):
        self.config, self.probe = config, probe
        if not config.key_data_dump:
            self.save = _noop
        if not config.configurations_dump:
            self.save_config = _noop
        if not (config.key_data_dump if config.metrics_dump is None else config.metrics_dump):
            self.log_metrics = _noop
        if not config.grads_dump:
            self.monitor_grads = _noop
        if not config.param_fingerprints:
            self.monitor_params = _noop

    @property
    def current_step(self) -> int:
        return self.probe.current_step

    def save(self, data: Any, sample_ids: Any = None, group_ids: Any = None) -> None:
        self.probe.save(data, sample_ids, group_ids)

    def save_config(self, config: Any) -> None:
        self.probe.save_config(config)

    def replay(self, data: Any, micro_step: Any = None) -> Any:
        return self.probe.replay(data, micro_step)

    def log_metrics(self, metrics: Any, step: Any = None) -> None:
        self.probe.log_metrics(metrics, step)

    def monitor_grads(self, *args: Any, **kwargs: Any) -> Any:
        return self.probe.monitor_grads(*args, **kwargs)

    def monitor_params(self, *args: Any, **kwargs: Any) -> Any:
        return self.probe.monitor_params(*args, **kwargs)

    def stage(self, name: str, model: Any = None, *, steps: Any = None, backward: bool | None = None,
              tensors: bool | None = None, weights: bool | None = None) -> Any:
        """The stage's module dump when the config switches it on for this step (an explicit `steps` narrows it)."""
        step = self.probe.current_step
        if name not in self.config.stages or not self.config.in_steps(step):
            return NULL_STAGE
        wanted = steps_of(steps)
        if wanted is not None and step not in wanted:
            return NULL_STAGE
        return self.probe.stage(name, model, backward=backward,
                                tensors=self.config.tensors if tensors is None else tensors,
                                weights=self.config.stage_weights if weights is None else weights)

    def step(self) -> None:
        self.probe.step()

    def flush(self) -> None:
        self.probe.flush()

    def close(self) -> None:
        self.probe.close()

    def __enter__(self) -> "ConfiguredProbe":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:  # path, rank, layout, ... of the real probe
        return getattr(self.probe, name)

    def __repr__(self) -> str:
        return f"ConfiguredProbe({self.probe!r}, stages={sorted(self.config.stages)})"


def apply_overrides(cfg: dict[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """Set dotted keys in a nested config dict in place ({"ppo.steps": 2}); returns cfg."""
    for dotted, value in (overrides or {}).items():
        node = cfg
        *parents, leaf = dotted.split(".")
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = value
    return cfg


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def from_config(cfg: Any, **probe_kwargs: Any) -> "ConfiguredProbe | DisabledProbe":
    """A probe switched by `cfg`'s rlprobe_config (or msprobe_config) section; DisabledProbe when nothing is on.

    `probe_kwargs` go to rlprobe.Probe (framework, mode, rank, ...); the config's `mode` is used when none is given."""
    config = parse_config(cfg)
    if not config.any_switch:
        return DisabledProbe()
    from rlprobe.capture.probe import Probe

    if config.mode is not None:
        probe_kwargs.setdefault("mode", config.mode)
    if config.flush_interval is not None:
        probe_kwargs.setdefault("flush_interval", config.flush_interval)
    if config.replay_from is not None:
        probe_kwargs.setdefault("replay_from", config.replay_from)
    if config.summed_keys is not None:
        probe_kwargs.setdefault("summed_keys", list(config.summed_keys))
    return ConfiguredProbe(config, Probe(config.dump_path, **probe_kwargs))
