"""Dumps rewritten in the key-data layouts before the packed files (docs/dump-format.md, "Files"), for the
tests of readers that still read them and of behaviours of one whole .npy file a tensor (a file replaced,
truncated or removed)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rlprobe.lake.layout import key_data_file_name
from rlprobe.lake.tensor_pack import load_record, record_of


def call_folder_file(row: dict) -> str:
    """Where the format put a key-data tensor from issue 15 to the seventh session: a folder per save call
    (numbered here by the row's micro step: a key saved once a call, as the tests do)."""
    return (f"tensors/key_data/step={row['step']}/rank={row['rank']}/call={row['micro_step']}/"
            f"{key_data_file_name(row['key'], row['index'])}")


def unpack(path: Path, where: Callable[[dict], str] = call_folder_file) -> None:
    """Rewrite a packed dump as an earlier format wrote it: each record a .npy file at where(row), the rows'
    tensor_file rewritten and their tensor_offset and tensor_length columns dropped (parts had none)."""
    packs = set()
    for part in sorted((path / "stats" / "key_data").glob("rank=*/part-*.parquet")):
        rank = int(part.parent.name[5:])
        table = pq.read_table(part, partitioning=None)
        files = []
        for row in table.to_pylist():
            if row["tensor_file"] is None:
                files.append(None)
                continue
            old = where({**row, "rank": rank})
            (path / old).parent.mkdir(parents=True, exist_ok=True)
            np.save(path / old, load_record(str(path / row["tensor_file"]),
                                            record_of(row["tensor_offset"], row["tensor_length"])))
            files.append(old)
            packs.add(row["tensor_file"])
        table = table.set_column(table.schema.get_field_index("tensor_file"), "tensor_file", pa.array(files, pa.string()))
        pq.write_table(table.drop_columns(["tensor_offset", "tensor_length"]), part)
    for pack in packs:
        (path / pack).unlink()


def step_packs(path: Path) -> None:
    """Rewrite a packed dump as change 13 wrote it (the twelfth session): a packed file a step and rank,
    `tensors/key_data/step=<S>/rank=<R>/call=<C>.npys`, C the step's first call (numbered here by the first
    row's micro step), each record copied, the rows' tensor_file and tensor_offset rewritten."""
    packs, out = set(), {}
    for part in sorted((path / "stats" / "key_data").glob("rank=*/part-*.parquet")):
        rank = int(part.parent.name[5:])
        table = pq.read_table(part, partitioning=None)
        files, offsets = [], []
        for row in table.to_pylist():
            if row["tensor_file"] is None:
                files.append(None)
                offsets.append(None)
                continue
            with open(path / row["tensor_file"], "rb") as f:
                f.seek(row["tensor_offset"])
                record = f.read(row["tensor_length"])
            key = (row["step"], rank)
            if key not in out:
                out[key] = (f"tensors/key_data/step={row['step']}/rank={rank}/call={row['micro_step']}.npys",
                            bytearray())
            name, data = out[key]
            offsets.append(len(data))
            data += record + bytes(-len(record) % 64)
            files.append(name)
            packs.add(row["tensor_file"])
        table = table.set_column(table.schema.get_field_index("tensor_file"), "tensor_file", pa.array(files, pa.string()))
        table = table.set_column(table.schema.get_field_index("tensor_offset"), "tensor_offset",
                                 pa.array(offsets, pa.int64()))
        pq.write_table(table, part)
    for pack in packs:
        (path / pack).unlink()
    for name, data in out.values():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(bytes(data))


def rewrite_record(path: Path, row: dict, data: bytes) -> None:
    """Write `data` over the record of a key-data row in its packed file, in place (the same length)."""
    assert row["tensor_offset"] is not None and len(data) == row["tensor_length"], (len(data), row)
    with open(path / row["tensor_file"], "r+b") as f:
        f.seek(row["tensor_offset"])
        f.write(data)
