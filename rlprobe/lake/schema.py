"""Arrow schemas of the stats tables. Partition columns (rank) live only in the path."""

from __future__ import annotations

import pyarrow as pa

from rlprobe.lake.statistics import STATISTICS

_ARROW = {"float64": pa.float64(), "int64": pa.int64()}


def _tensor_columns() -> list[pa.Field]:
    return [
        pa.field("dtype", pa.string()),
        pa.field("framework", pa.string()),
        pa.field("shape", pa.list_(pa.int64())),
        pa.field("numel", pa.int64()),
        *[pa.field(s.name, _ARROW[s.arrow_type]) for s in STATISTICS],
        pa.field("hash", pa.string()),
        pa.field("tensor_file", pa.string()),
    ]


KEY_DATA = pa.schema(
    [
        pa.field("key", pa.string()),
        pa.field("step", pa.int64()),
        pa.field("micro_step", pa.int64()),
        pa.field("index", pa.string()),
        *_tensor_columns(),
        # true: the value saved was None (a trainer's "not computed"); no tensor, no statistics.
        # Parts written before this column existed read it as null (= a value was saved).
        pa.field("absent", pa.bool_()),
        # a packed tensor file (one a save call): the record's bytes into tensor_file and its length
        # (header and data); null: tensor_file is one whole .npy (lake/tensor_pack.py)
        pa.field("tensor_offset", pa.int64()),
        pa.field("tensor_length", pa.int64()),
    ]
)

SCALAR = pa.schema(
    [
        pa.field("step", pa.int64()),
        pa.field("name", pa.string()),
        pa.field("value", pa.float64()),
        pa.field("wall_time", pa.float64()),
    ]
)

MODULE = pa.schema(
    [
        pa.field("stage", pa.string()),
        pa.field("step", pa.int64()),
        pa.field("module", pa.string()),
        pa.field("call", pa.int64()),
        pa.field("direction", pa.string()),
        pa.field("io", pa.string()),
        pa.field("index", pa.string()),
        pa.field("seq", pa.int64()),
        *_tensor_columns(),
    ]
)

# gradient statistics (capture/grads.py); contract details in docs/grads.md
GRAD = pa.schema(
    [
        pa.field("monitor", pa.string()),
        pa.field("param", pa.string()),
        pa.field("step", pa.int64()),  # this optimizer's step count
        pa.field("probe_step", pa.int64()),
        pa.field("level", pa.string()),
        pa.field("framework", pa.string()),
        pa.field("dtype", pa.string()),
        pa.field("shape", pa.list_(pa.int64())),
        pa.field("numel", pa.int64()),
        pa.field("max", pa.float64()),
        pa.field("min", pa.float64()),
        pa.field("norm", pa.float64()),
        pa.field("digest", pa.string()),
        pa.field("digest_algo", pa.string()),
        pa.field("bounds", pa.list_(pa.float64())),
        pa.field("bucket_fractions", pa.list_(pa.float64())),
        pa.field("zero_fraction", pa.float64()),
        pa.field("sign_file", pa.string()),
        pa.field("sign_offset", pa.int64()),  # bytes into sign_file; null: sign_file is a bool .npy (msprobe)
        pa.field("sign_numel", pa.int64()),  # bits (elements) from sign_offset
    ]
)

# parameter fingerprints after each optimizer step (capture/params.py; docs/dump-format.md, "param")
PARAM = pa.schema(
    [
        pa.field("monitor", pa.string()),
        pa.field("param", pa.string()),
        pa.field("position", pa.int64()),  # the parameter's place in the model's order: "first parameter"
        pa.field("step", pa.int64()),  # this optimizer's step count; the weights after that step
        pa.field("probe_step", pa.int64()),
        pa.field("framework", pa.string()),
        pa.field("dtype", pa.string()),
        pa.field("shape", pa.list_(pa.int64())),
        pa.field("numel", pa.int64()),
        pa.field("digest", pa.string()),  # mix64 of the raw bytes: bit-exact on one device
        pa.field("digest_algo", pa.string()),
        pa.field("sum", pa.float64()),  # float statistics, compared within the dtype's tolerance (fingerprint_macros.sql)
        pa.field("norm", pa.float64()),
    ]
)

# the weights at a module dump: each hooked module's own parameters when a stage block starts
# (capture/stage_weights.py; docs/dump-format.md, "module_param")
MODULE_PARAM = pa.schema(
    [
        pa.field("stage", pa.string()),
        pa.field("step", pa.int64()),
        pa.field("block", pa.int64()),  # the stage's block (`with probe.stage`) in this step, from 0
        pa.field("module", pa.string()),
        pa.field("call", pa.int64()),  # the module's forward calls in this stage and step before the block
        pa.field("param", pa.string()),  # its own name in the module: "weight", "bias"
        pa.field("position", pa.int64()),  # the place among the block's parameters: "first parameter"
        pa.field("framework", pa.string()),
        pa.field("dtype", pa.string()),
        pa.field("shape", pa.list_(pa.int64())),
        pa.field("numel", pa.int64()),
        pa.field("digest", pa.string()),  # as PARAM's: mix64 of the raw bytes
        pa.field("digest_algo", pa.string()),
        pa.field("sum", pa.float64()),
        pa.field("norm", pa.float64()),
    ]
)

# sample identity and per-row statistics of batch tensors (written by lake/samples.py; docs/dump-format.md);
# here, not there, so that reading a dump does not load the sample writer (start-up)
SAMPLE = pa.schema([
    pa.field("key", pa.string()),
    pa.field("index", pa.string()),
    pa.field("step", pa.int64()),
    pa.field("micro_step", pa.int64()),
    pa.field("row", pa.int64()),  # position along the leading dimension of the saved tensor
    pa.field("sample", pa.int64()),  # identity: 64-bit hash of the prompt row, or of the given sample id
    pa.field("sample_id", pa.string()),  # the id given to save(sample_ids=...); null when derived
    pa.field("occurrence", pa.int64()),  # earlier rows of this sample for this key in the step
    pa.field("group_id", pa.string()),  # save(group_ids=...): the GRPO group; null when not given
    pa.field("dtype", pa.string()),
    pa.field("row_numel", pa.int64()),
    pa.field("row_hash", pa.int64()),  # 64-bit hash of the row's bytes in the original dtype
    pa.field("row_sum", pa.float64()),
    pa.field("row_min", pa.float64()),
    pa.field("row_max", pa.float64()),
])

SCHEMAS: dict[str, pa.Schema] = {"key_data": KEY_DATA, "scalar": SCALAR, "module": MODULE, "grad": GRAD,
                                 "sample": SAMPLE, "param": PARAM, "module_param": MODULE_PARAM}
# rank added by readers from the hive path
RANK_FIELD = pa.field("rank", pa.int64())


def with_rank(schema: pa.Schema) -> pa.Schema:
    return schema.append(RANK_FIELD)


def step_column(kind: str) -> str:
    """The column holding the probe step a row belongs to (what `committed_steps` counts):
    gradient and parameter rows keep their optimizer's own count in `step`."""
    return "probe_step" if kind in ("grad", "param") else "step"


def schema_for(kind: str) -> pa.Schema:
    try:
        return SCHEMAS[kind]
    except KeyError:
        raise ValueError(f"no stats schema for kind {kind!r}; known: {sorted(SCHEMAS)}") from None
