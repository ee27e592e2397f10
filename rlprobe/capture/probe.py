"""rlprobe.Probe: the object training code talks to."""

from __future__ import annotations

import atexit
import json
import math
import operator
import os
import time
import uuid
import warnings
import weakref
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rlprobe.capture.calls import LeafJob, SaveCall
from rlprobe.capture.rank_claim import RankClaim, read_json, write_run_manifest
from rlprobe.capture.replay import open_replay
from rlprobe.capture.user_values import as_number, flatten, is_whole_number, jsonable, key_names, shape_of, whole
from rlprobe.capture.writer import BackgroundWriter
from rlprobe.capture.writer_process import end_session, prepare_calls, writer_process
from rlprobe.errors import ProbeError
from rlprobe.frameworks import broadcast_from_rank0, detect_rank_and_world, framework_names, prepare
from rlprobe.lake.atomic import atomic_write_json
from rlprobe.lake.layout import DumpLayout, check_text
from rlprobe.lake.samples import call_identity

if TYPE_CHECKING:
    from rlprobe.capture.grads import GradMonitor
    from rlprobe.capture.params import ParamMonitor

Mode = Literal["new", "overwrite", "append"]
OnError = Literal["raise", "warn"]


class Probe:
    """Saves key data, configs and per-step scalars of one rank into a dump directory.

    >>> probe = Probe("./dump")
    >>> probe.save({"log_prob": log_prob}); probe.step(); probe.close()

    Ended steps are committed (their stats rows written as one Parquet part, the rank manifest
    updated) at most every `flush_interval` seconds, and at `flush()` and `close()`: a crash
    loses the rows of the steps ended in the last `flush_interval` seconds, never a committed
    step. 0 commits every step as it ends (the cost of a part per step, ~2-5 ms of writer work
    that competes with training for the GIL, only matters when steps are this short).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        framework: str | None = None,
        *,
        mode: Mode = "new",
        stats_only: bool = False,
        on_error: OnError = "raise",
        rank: int | None = None,
        world_size: int | None = None,
        run_id: str | None = None,
        tags: dict[str, Any] | None = None,
        start_step: int | None = None,
        max_inflight_bytes: int = 1 << 30,
        flush_interval: float = 1.0,
        replay_from: str | os.PathLike[str] | None = None,
        summed_keys: Any = (),
    ):
        if framework is not None and framework not in framework_names():
            raise ProbeError(f"framework={framework!r}: expected one of {', '.join(framework_names())} or None "
                             "(detect)")
        if mode not in ("new", "overwrite", "append"):
            raise ProbeError(f"mode={mode!r}: expected 'new', 'overwrite' or 'append'")
        if on_error not in ("raise", "warn"):
            raise ProbeError(f"on_error={on_error!r}: expected 'raise' or 'warn'")
        if isinstance(flush_interval, bool) or not isinstance(flush_interval, (int, float)) \
                or not 0 <= flush_interval < math.inf:
            raise ProbeError(f"flush_interval={flush_interval!r}: expected seconds, a finite number >= 0 "
                             "(0 commits every step as it ends)")
        if not isinstance(path, (str, os.PathLike)) or not isinstance(os.fspath(path), str) or not os.fspath(path):
            raise ProbeError(f"path={path!r}: expected the dump directory as a non-empty str or os.PathLike "
                             "(it is created if missing)")
        if start_step is not None and (not is_whole_number(start_step) or start_step < 0):
            raise ProbeError(f"start_step={start_step!r}: expected a whole number >= 0, or None (continue the run)")
        self.summed_keys = key_names("summed_keys", summed_keys)
        # e.g. the host staging ring's first pages are faulted in by a thread of its own from now
        # on, while the rest of the set-up runs
        prepare(framework)
        process = writer_process()  # started now, its imports overlap with the rest of the set-up
        self.path = Path(path)
        self.layout = DumpLayout(self.path)
        self.framework = framework
        self.stats_only = stats_only
        self.on_error = on_error
        self._closed = True  # until fully constructed
        detected = detect_rank_and_world() if rank is None or world_size is None else (rank, world_size)
        self.rank = whole("rank", detected[0] if rank is None else rank, rank is None)
        self.world_size = whole("world_size", detected[1] if world_size is None else world_size, world_size is None)

        # agree on the run id before anything can fail on one rank only: a rank that raised
        # before the broadcast would leave the others waiting in it for ever
        chosen = run_id or os.environ.get("RLPROBE_RUN_ID")
        if chosen is None:
            old = (read_json(self.layout.rank_manifest(self.rank)) or {}) if mode == "append" else {}
            chosen = self._agree_run_id(old.get("run_id"))
        self.run_id = chosen
        if not 0 <= self.rank < self.world_size:
            source = " (from the environment: RANK, WORLD_SIZE)" if rank is None or world_size is None else ""
            raise ProbeError(f"rank={self.rank}, world_size={self.world_size}{source}: expected world_size >= 1 and "
                             "0 <= rank < world_size")
        self._replay = open_replay(replay_from, self.path, self.rank)  # refused before a file is touched
        claim = RankClaim(self.layout, self.rank, self.world_size)
        claim.prepare_directory()
        from rlprobe.lake.rank_lock import RankLock

        # held until close(): no other process (a second Probe, `rlprobe compact`) touches this
        # rank's files meanwhile; the kernel drops it if this process dies
        self._lock = RankLock.acquire(self.path, self.rank, "rlprobe.Probe")
        try:
            previous = claim.claim(mode)
            if start_step is None:
                done = (previous or {}).get("committed_steps") or []
                start_step = max(done) + 1 if done else 0
            self.current_step = start_step
            self._micro: dict[str, int] = {}
            self._calls = 0  # save calls with data in the current step: the next one's folder
            self._step_has_data = False

            from rlprobe.lake.rank_writer import RankWriter

            sink = RankWriter(self.layout, self.rank, self.world_size, self.run_id,
                              {"framework": framework or "auto", "mode": mode, "stats_only": stats_only},
                              previous=previous, lock=self._lock)
            if self.rank == 0 and not (mode == "append" and self.layout.run_manifest.exists()):
                write_run_manifest(self.layout, self.run_id, self.framework, self.world_size, self.stats_only,
                                   tags or {}, self.summed_keys, self._replay.record)
            # resuming: a killed run's uncommitted last steps (or an incomplete step) would
            # otherwise sit beside the new ones
            resume = previous is not None and (not previous.get("closed") or previous.get("incomplete_steps"))
            errors = sink.drop_uncommitted() if resume else []
            errors = errors or sink.write_manifest()
            if errors:
                raise ProbeError(f"cannot write to the dump directory {self.path}: {errors[0]}")
        except BaseException:
            self._lock.release()
            raise
        self.writer = BackgroundWriter(sink, max_inflight_bytes, float(flush_interval), process, prepare_calls)
        self._closed = False
        me = weakref.ref(self)
        self._atexit = lambda: (p := me()) is not None and p.close()
        atexit.register(self._atexit)

    # -- setup ---------------------------------------------------------------------------
    def _agree_run_id(self, previous: str | None) -> str:
        """Rank 0's run id for every rank (its earlier one when appending), else a new one."""
        run_id = previous or os.environ.get("TORCHELASTIC_RUN_ID") \
            or time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:8]
        return broadcast_from_rank0(run_id) if self.world_size > 1 else run_id

    # -- capture -------------------------------------------------------------------------
    def save(self, data: dict[str, Any], sample_ids: Any = None, group_ids: Any = None,
             micro_step: int | None = None) -> None:
        """Save key data: each value a tensor, array, scalar, or a nested list/tuple/dict of them.
        None (a value the trainer did not compute) is recorded as a row marked absent. Each key goes
        to its next micro-step of the step, or to `micro_step` where given (its count then unchanged).

        `sample_ids` (one int or string per row of the batch tensors; default: derived from the
        prompt ids saved in the call) and `group_ids` (GRPO groups) let runs with different
        layouts be compared per sample: docs/dump-format.md, "Samples"."""
        where = f"rank {self.rank} step {self.current_step}"
        if not self.usable(where):
            return
        if micro_step is not None and (not is_whole_number(micro_step) or micro_step < 0):
            return self.fail(f"{where}: save(micro_step={micro_step!r}): expected a whole number >= 0, or None")
        try:
            leaves = flatten(data, where)
            identity = call_identity([(k, i, shape_of(leaf)) for k, i, leaf, _ in leaves], sample_ids,
                                     group_ids, where)
        except ProbeError as e:
            self.fail(str(e))
            return
        # stage per framework, keeping the caller's order
        by_adapter: dict[str, list[int]] = {}
        for i, (_, _, _, adapter) in enumerate(leaves):
            if adapter is not None:
                by_adapter.setdefault(adapter.name, []).append(i)
        staged: list[Any] = [None] * len(leaves)
        for name, idx in by_adapter.items():
            adapter = leaves[idx[0]][3]
            try:
                # statistics-only: batch tensors still come to the host for their per-row statistics
                out = adapter.stage([leaves[i][2] for i in idx], keep_raw=not self.stats_only or identity is not None)
            except ProbeError as e:
                self.fail(f"{where}: {e}")
                return
            for i, leaf in zip(idx, out):
                staged[i] = leaf
        micro: dict[str, int] = {}
        for key, _, _, _ in leaves:
            micro.setdefault(key, self._micro.get(key, 0) if micro_step is None else operator.index(micro_step))
        for key in micro if micro_step is None else ():
            self._micro[key] = micro[key] + 1
        jobs = [LeafJob(key, index, micro[key], self.framework or (adapter.name if adapter else None), leaf)
                for (key, index, _, adapter), leaf in zip(leaves, staged)]
        nbytes = sum(j.leaf.nbytes for j in jobs if j.leaf is not None)
        self.writer.defer(SaveCall(self.layout, self.current_step, jobs, not self.stats_only, identity, self._calls),
                           nbytes, call=True)
        self._calls += 1
        self._step_has_data = True
        self.raise_background_errors()

    def replay(self, data: dict[str, Any], micro_step: int | None = None) -> dict[str, Any]:
        """The baseline's tensors (replay_from) of `data`'s keys at this step, rank and the micro-step their next
        save gets (or `micro_step`), as `data`'s types and devices; `data` itself when replay is off (docs/replay.md)."""
        return self._replay.values(data, self.current_step, self._micro if micro_step is None else micro_step)

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Record scalars such as timings, throughput and losses, at `step` (default: the current
        step). A step that has already ended is fine: a callback that runs after `step()` passes
        the step its values belong to, and readers show them there."""
        where = f"rank {self.rank} step {self.current_step if step is None else step}"
        if not self.usable(where):
            return
        if step is not None and (not is_whole_number(step) or step < 0):
            self.fail(f"rank {self.rank}: log_metrics(step={step!r}): expected a whole number >= 0, "
                       "or None for the current step")
            return
        at = self.current_step if step is None else operator.index(step)
        if not isinstance(metrics, dict):
            self.fail(f"{where}: log_metrics() takes a dict of name -> number, got {type(metrics).__name__}")
            return
        rows = []
        now = time.time()
        for name, value in metrics.items():
            try:
                check_text(name, "metric name", where)
            except ProbeError as e:
                self.fail(f"{e} (metric names must be non-empty strings)")
                return
            try:
                number = as_number(value)
            except ProbeError as e:
                self.fail(f"{where}, metric {name!r}: {e}")
                return
            if number is None:
                self.fail(f"{where}, metric {name!r}: expected a number (int, float, 0-d tensor or array), "
                           f"got {type(value).__name__}")
                return
            rows.append({"step": at, "name": name, "value": number, "wall_time": now})
        sink = self.writer.sink
        self.writer.defer(lambda: [sink.add_row("scalar", r) for r in rows], 0, at)
        if at == self.current_step:
            self._step_has_data = True
        self.raise_background_errors()

    def save_config(self, config: dict[str, Any]) -> None:
        """Store the training configuration (configurations.json; other ranks: configurations.rank<R>.json)."""
        where = f"rank {self.rank}"
        if not self.usable(where):
            return
        if not isinstance(config, dict):
            self.fail(f"{where}: save_config() takes a dict, got {type(config).__name__}")
            return
        try:
            text = json.dumps(config, default=jsonable, indent=2)
        except (TypeError, ValueError) as e:
            self.fail(f"{where}: save_config(): configuration is not JSON-serialisable: {e}")
            return
        try:
            atomic_write_json(self.layout.config_file(self.rank), json.loads(text))
        except OSError as e:
            self.fail(f"{where}: could not write {self.layout.config_file(self.rank)}: {e}")

    def stage(self, name: str, model: Any = None, *, steps: Any = None, backward: bool | None = None,
              tensors: bool = False, weights: bool = True) -> Any:
        """Module-level dump inside a `with` block: every submodule's inputs/outputs (and, for `*_update`
        stages or backward=True, its gradients), and with `weights` a fingerprint of each module's own
        parameters as the block starts; outside `steps` nothing is installed. See docs/modules.md."""
        from rlprobe.capture.stages import stage_context

        return stage_context(self, name, model, steps, backward, tensors, weights)

    def monitor_grads(self, model: Any = None, optimizer: Any = None, *, name: str = "default", level: str = "L1",
                      bounds: list[float] | None = None, params: list[str] | None = None, steps: Any = None,
                      ranks: Any = None) -> "GradMonitor":
        """Record gradient statistics (and, at L1/L2, sign maps) at every step of the optimizer that
        steps `model`'s parameters; returns a removable handle (see docs/grads.md)."""
        from rlprobe.capture.grads import GradMonitor

        self.usable(f"rank {self.rank}: monitor_grads(name={name!r})")
        monitor = GradMonitor(self, model, optimizer, name=name, level=level, bounds=bounds, params=params,
                              steps=steps, ranks=ranks)
        self.__dict__.setdefault("_grad_monitors", []).append(monitor)
        return monitor

    def monitor_params(self, model: Any = None, optimizer: Any = None, *, name: str = "default",
                       params: list[str] | None = None, steps: Any = None, ranks: Any = None) -> "ParamMonitor":
        """Record a fingerprint of every parameter (digest of its bytes, sum, norm) after each step
        of the optimizer that steps `model`'s parameters; returns a removable handle
        (docs/dump-format.md, "param")."""
        from rlprobe.capture.params import ParamMonitor

        self.usable(f"rank {self.rank}: monitor_params(name={name!r})")
        monitor = ParamMonitor(self, model, optimizer, name=name, params=params, steps=steps, ranks=ranks)
        self.__dict__.setdefault("_grad_monitors", []).append(monitor)
        return monitor

    def step(self) -> None:
        """End the current step: its rows are committed as one part per kind."""
        if not self.usable(f"rank {self.rank} step {self.current_step}"):
            return
        self._commit(self.current_step)
        self.current_step += 1
        self._micro.clear()
        self._calls = 0
        self._step_has_data = False
        self.raise_background_errors()

    def flush(self) -> None:
        """Write everything saved so far and wait until it is on disk."""
        if not self.usable(f"rank {self.rank} step {self.current_step}"):
            return
        sink = self.writer.sink
        self.writer.submit(lambda: self.writer.report(sink.flush(None)))
        self.writer.wait_idle()
        self.raise_background_errors()

    def close(self) -> None:
        """Write everything, merge stats parts, mark this rank complete. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._atexit)
        for monitor in self.__dict__.pop("_grad_monitors", []):
            monitor.remove()
        writer = self.writer
        try:
            if self._step_has_data:
                self._commit(self.current_step)
            writer.submit(lambda: writer.report(writer.sink.close()))
            writer.wait_idle()
            writer.stop()
            end_session(writer)
        finally:
            if not writer.alive:
                self._lock.release()
        self.raise_background_errors()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "Probe":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"step {self.current_step}"
        return f"Probe({str(self.path)!r}, rank={self.rank}/{self.world_size}, {state})"

    # -- internals -----------------------------------------------------------------------
    def _commit(self, step: int) -> None:
        """End `step`; the writer commits it within flush_interval seconds (flush()/close(): at once)."""
        self.writer.defer(partial(self.writer.sink.end_step, step))
        self.writer.step_ended()  # work due before the next step ends starts now, at the step boundary

    # -- what monitors (capture/grads.py, params.py, stages.py) use ----------------------------
    def wrote_rows(self) -> None:
        """A monitor handed the writer rows of the current step: step() commits the step."""
        self._step_has_data = True

    def usable(self, where: str) -> bool:
        """False (after failing as on_error says) when the probe is closed; `where` names the call."""
        if self._closed:
            self.fail(f"{where}: the probe on {self.path} is closed")
            return False
        return True

    def raise_background_errors(self) -> None:
        """Fail (as on_error says) with the first error the writer met since the last call."""
        errors = self.writer.take_errors()
        if errors:
            manifest = self.layout.rank_manifest(self.rank)
            more = f" (and {len(errors) - 1} more; see {manifest})" if len(errors) > 1 else ""
            self.fail(errors[0] + more)

    def fail(self, message: str) -> None:
        """Raise ProbeError(message), or warn with it under on_error="warn"."""
        if self.on_error == "warn":
            warnings.warn(f"rlprobe: {message}", RuntimeWarning, stacklevel=3)
        else:
            raise ProbeError(message)
