"""key_data.parquet and key_data.csv rendered in memory by a thread as soon as the comparison has
its key_data table, while it still runs the verdict's queries and the later comparisons
(`rlprobe compare --workers 2`: rlprobe.comparison.run.compare_dumps's `key_data_ready`);
write_reports then only writes the bytes into the output folder. They are the bytes
write_key_data_parquet and write_key_data_csv write (comparison_files.py, csv_report.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa


class KeyDataFiles:
    """`start(key_data)` renders the files on a thread; `write(folder)` waits for it and writes them
    (raising its error, if rendering failed). key_data.csv in `lang`, unless `csv` is false."""

    def __init__(self, lang: str = "en", csv: bool = True) -> None:
        self._lang = lang
        self._csv = csv
        self._thread: threading.Thread | None = None
        self._files: dict[str, bytes | pa.Buffer] = {}
        self._public: pa.Table | None = None  # key_data as the CSV shows it
        self._error: BaseException | None = None

    def start(self, key_data: pa.Table) -> None:
        # imported here, on the calling thread, which may import other modules while the thread renders:
        # no two threads in one import cycle (as rlprobe.comparison.run's later imports)
        from rlprobe.report import csv_report  # noqa: F401
        from rlprobe.report import comparison_files  # noqa: F401

        self._thread = threading.Thread(target=self._render, args=(key_data,), name="rlprobe-key-data-files",
                                        daemon=True)
        self._thread.start()

    def _render(self, key_data: pa.Table) -> None:
        from rlprobe.report.comparison_files import key_data_parquet_bytes, public_key_data
        from rlprobe.report.csv_report import key_data_csv_bytes

        try:
            self._files["key_data.parquet"] = key_data_parquet_bytes(key_data)
            if self._csv:
                self._public = public_key_data(key_data)
                self._files["key_data.csv"] = key_data_csv_bytes(self._public, self._lang)
        except BaseException as exc:  # noqa: BLE001 - raised again by write(), in the writing thread
            self._error = exc

    def write(self, folder: Path) -> None:
        if self._thread is None:
            raise RuntimeError("KeyDataFiles.write before start: the comparison never handed over key_data")
        self._thread.join()
        if self._error is not None:
            raise self._error
        (folder / "key_data.parquet").write_bytes(self._files["key_data.parquet"])
        if "key_data.csv" in self._files:
            from rlprobe.report import csv_report

            csv_report.write_key_data_csv(folder / "key_data.csv", self._public, self._lang,
                                          rendered=self._files["key_data.csv"])
