"""Dump's reading API refuses what it cannot mean: a kind that does not exist was read as an empty table
(a typo looked like a dump without that data), a step given as a text ended in an Arrow kernel error, a manifest
of another format version was read as this one."""

from __future__ import annotations

import re

import numpy as np
import pytest

import rlprobe


def test_an_unknown_kind_and_a_step_that_is_no_number_are_named(tmp_path):
    with rlprobe.Probe(tmp_path / "d") as p:
        p.save({"old_log_prob": np.arange(4, dtype=np.float32)})
        p.step()
    d = rlprobe.open(tmp_path / "d")
    assert d.arrow("key_data").num_rows == 1 and d.arrow("grad").num_rows == 0  # a kind the dump lacks: empty
    with pytest.raises(ValueError, match=r"no stats schema for kind 'keydata'; known: \['grad', 'key_data'"):
        d.arrow("keydata")
    assert (d.tensor("old_log_prob", np.int64(0)) == np.arange(4)).all()
    for bad in ({"step": "0"}, {"step": 0.0}, {"step": 0, "rank": True}, {"step": 0, "micro_step": None}):
        with pytest.raises(ValueError, match="step, rank and micro_step take whole numbers"):
            d.tensor("old_log_prob", **bad)


def test_a_manifest_that_is_no_object_or_of_another_format_version_is_named(tmp_path):
    """rlprobe.json holding a JSON list ended in an AttributeError traceback; a format_version this rlprobe does
    not read (a dump written by a newer one) was read as format 1."""
    from click.testing import CliRunner

    from rlprobe.cli import main

    with rlprobe.Probe(tmp_path / "d") as p:
        p.save({"old_log_prob": np.arange(4, dtype=np.float32)})
        p.step()
    manifest = tmp_path / "d" / "rlprobe.json"
    kept = manifest.read_text()
    for text, said in (("[]", "expected a JSON object ({...}), found a JSON list"),
                       ('{"format_version": 999}', "format_version 999, where this rlprobe reads dumps of format 1")):
        manifest.write_text(text)
        with pytest.raises(rlprobe.DumpReadError, match=re.escape(f"{manifest}: {said}")):
            rlprobe.open(tmp_path / "d").manifest
        result = CliRunner().invoke(main, ["info", str(tmp_path / "d")])
        assert result.exit_code == 3 and said in result.output
    manifest.write_text(kept)
    rank = tmp_path / "d" / "rank0.json"
    rank.write_text(rank.read_text().replace('"format_version": 1', '"format_version": 2'))
    result = CliRunner().invoke(main, ["compare", str(tmp_path / "d"), str(tmp_path / "d"), "-o", str(tmp_path / "o")])
    assert result.exit_code == 3 and f"{rank}: format_version 2" in result.output
    assert not (tmp_path / "o").exists()
