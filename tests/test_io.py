"""Atomic outputs: a failure leaves neither the target nor a temporary file behind."""

import json

import pytest

from qac.io import atomic_path, iter_jsonl, path_md5, write_jsonl


def test_failed_write_leaves_nothing(tmp_path):
    target = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("stage crashed")
    assert list(tmp_path.iterdir()) == []


def test_failed_directory_write_keeps_previous_version(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "weights").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target, directory=True) as tmp:
            (tmp / "weights").write_text("new, half written")
            raise RuntimeError("crash")
    assert (target / "weights").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_directory_replaced_on_success(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "stale").write_text("old")
    with atomic_path(target, directory=True) as tmp:
        (tmp / "weights").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["weights"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_jsonl_round_trip_and_bad_line(tmp_path):
    path = tmp_path / "a.jsonl"
    assert write_jsonl(path, [{"a": 1}, {"b": "é"}]) == 2
    assert list(iter_jsonl(path)) == [{"a": 1}, {"b": "é"}]
    path.write_text(json.dumps({"a": 1}) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"a\.jsonl:2"):
        list(iter_jsonl(path))


def test_directory_hash_depends_on_names_and_contents(tmp_path):
    a = tmp_path / "a"
    a.mkdir()
    (a / "x").write_text("1")
    first = path_md5(a)
    (a / "x").write_text("2")
    assert path_md5(a) != first
    (a / "x").write_text("1")
    assert path_md5(a) == first


def test_outputs_get_ordinary_permissions(tmp_path):
    import os
    import stat

    umask = os.umask(0o022)
    os.umask(umask)
    write_jsonl(tmp_path / "f.jsonl", [{"a": 1}])
    with atomic_path(tmp_path / "d", directory=True) as tmp:
        (tmp / "x").write_text("1")
    assert stat.S_IMODE((tmp_path / "f.jsonl").stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o777 & ~umask
