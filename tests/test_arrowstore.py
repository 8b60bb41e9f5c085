"""Arrow files between stages (qac.data.arrowstore): schema, fixed batches, row access, errors."""

from __future__ import annotations

import pytest

from qac.data.arrowstore import (QUERIES_SCHEMA, RowGather, iter_records, open_queries, scan_tables,
                                 write_queries)
from qac.data.errors import DataFormatError


def records(n: int) -> list[dict]:
    return [{"pid": f"d{i // 3}#{i % 3}", "queries": [f"query {i}"] * (i % 4)} for i in range(n)]


def test_rows_round_trip_in_fixed_batches_and_open_as_a_hugging_face_dataset(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr("qac.data.arrowstore.ROWS_PER_BATCH", 4)
    path = tmp_path / "queries.arrow"
    assert write_queries(path, records(10)) == 10
    table = open_queries(path)
    assert [batch.num_rows for batch in table.to_batches()] == [4, 4, 2]
    assert list(iter_records(path, QUERIES_SCHEMA)) == records(10)
    assert datasets.Dataset.from_file(str(path))[7] == records(10)[7]
    # The same rows give the same bytes, whether written at once or from a generator.
    write_queries(tmp_path / "again.arrow", iter(records(10)))
    assert (tmp_path / "again.arrow").read_bytes() == path.read_bytes()


def test_row_gather_returns_rows_in_the_order_asked_across_batches(tmp_path, monkeypatch):
    monkeypatch.setattr("qac.data.arrowstore.ROWS_PER_BATCH", 3)
    path = tmp_path / "queries.arrow"
    write_queries(path, records(11))
    gather = RowGather(open_queries(path))
    asked = [10, 0, 5, 5, 3, 2]
    assert gather.rows(asked) == [records(11)[i] for i in asked]
    assert gather.rows([4], ["pid"]) == [{"pid": "d1#1"}]
    with pytest.raises(IndexError):
        gather.rows([11])


def test_scan_tables_cuts_the_file_into_slices_of_the_asked_size(tmp_path, monkeypatch):
    monkeypatch.setattr("qac.data.arrowstore.ROWS_PER_BATCH", 3)
    path = tmp_path / "queries.arrow"
    write_queries(path, records(11))
    slices = list(scan_tables(path, QUERIES_SCHEMA, 4))
    assert [part.num_rows for part in slices] == [4, 4, 3]
    assert [row for part in slices for row in part.to_pylist()] == records(11)


def test_a_bad_record_names_file_row_and_field_and_writes_nothing(tmp_path):
    path = tmp_path / "queries.arrow"
    bad = records(3)
    bad[2]["queries"] = "a string, not a list"
    with pytest.raises(DataFormatError, match=r"queries.arrow:3: field 'queries': expected a list"):
        write_queries(path, bad)
    del bad[1]["pid"]
    with pytest.raises(DataFormatError, match=r"queries.arrow:2: field 'pid': missing"):
        write_queries(path, bad)
    assert list(tmp_path.iterdir()) == []      # atomic: neither the file nor a temporary one
