"""Arrow files between stages (qac.data.arrowstore): schema, fixed batches, row access, errors."""

from __future__ import annotations

import pytest

import sys

from qac.data.arrowstore import (QUERIES_SCHEMA, RowGather, iter_records, open_mapped, open_queries, scan_tables,
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


def mapping_resident_kb(path) -> int:
    """Resident kilobytes of this process's mappings of ``path`` (from /proc/self/smaps)."""
    resident, inside = 0, False
    for line in open("/proc/self/smaps", encoding="utf-8"):
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:      # a mapping's header line
            inside = len(fields) >= 6 and fields[5] == str(path)
        elif inside and fields[0] == "Rss:":
            resident += int(fields[1])
    return resident


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_released_pages_leave_the_process_and_the_rows_still_read(tmp_path, monkeypatch):
    # 4,000 rows of ~1 kB in batches of 64: a 4 MB file of 63 batches.
    monkeypatch.setattr("qac.data.arrowstore.ROWS_PER_BATCH", 64)
    path = tmp_path / "queries.arrow"
    rows = [{"pid": f"d{i}#0", "queries": [f"{i} " + "x" * 1000]} for i in range(4000)]
    write_queries(path, rows)
    mapped = open_mapped(path, QUERIES_SCHEMA)
    gather = RowGather(mapped.table, mapped, release_rows=10 ** 9)
    assert gather.rows(list(range(0, 4000, 7))) == rows[::7]
    touched = mapping_resident_kb(path)
    assert touched >= 4000 / 7 * 4          # every gathered row's page is resident ...
    mapped.release()
    assert mapping_resident_kb(path) == 0   # ... until released; the data is not lost:
    assert gather.rows([3999, 0]) == [rows[3999], rows[0]]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_row_gather_and_a_full_pass_keep_only_a_bounded_share_of_the_file_resident(tmp_path, monkeypatch):
    # 8,000 rows of ~1 kB in batches of 512: an 8 MB file of 16 batches of ~512 kB.
    monkeypatch.setattr("qac.data.arrowstore.ROWS_PER_BATCH", 512)
    path = tmp_path / "queries.arrow"
    rows = [{"pid": f"d{i}#0", "queries": [f"{i} " + "x" * 1000]} for i in range(8000)]
    write_queries(path, rows)
    file_kb = path.stat().st_size // 1024
    mapped = open_mapped(path, QUERIES_SCHEMA)
    # Opening locates every batch header, which maps its page and the cached pages
    # around it (fault-around); the opening releases them as it goes.
    assert file_kb > 4000 and mapping_resident_kb(path) == 0
    gather = RowGather(mapped.table, mapped, release_rows=250)
    for start in range(0, 8000, 125):
        assert gather.rows(list(range(start, start + 125))) == rows[start:start + 125]
        # at most 250 rows of ~1 kB since the last release, each with its fault-around
        assert mapping_resident_kb(path) <= 256 + 2 * 64 + 256
    # A full pass with iter_records releases batch by batch (its own mapping).
    for index, record in enumerate(iter_records(path, QUERIES_SCHEMA)):
        assert record == rows[index]
        if index % 500 == 0:
            assert mapping_resident_kb(path) <= 512 + 2 * 64 + 256
    assert index == 7999


def test_an_empty_arrow_file_names_itself(tmp_path):
    path = tmp_path / "queries.arrow"
    path.write_bytes(b"")
    with pytest.raises(DataFormatError, match=r"queries.arrow.*not an Arrow stream file"):
        open_mapped(path, QUERIES_SCHEMA)


def corrupted_files(tmp_path):
    """A valid queries.arrow of a profile's data folder, then the same file damaged in the ways a disk,
    a copy or a killed writer damage files."""
    folder = tmp_path / "data" / "smoke"
    folder.mkdir(parents=True)
    good = folder / "queries.arrow"
    write_queries(good, [{"pid": f"d{i}#0", "queries": [f"query {i}"] * 3} for i in range(3000)])
    data = good.read_bytes()
    flipped = bytearray(data)
    for offset in range(8, 200):         # the schema message and the first batch header
        flipped[offset] ^= 0xFF
    return good, {
        "cut in the schema": data[:20],
        "cut in a batch": data[: len(data) // 2 + 7],
        "last byte missing": data[:-1],
        "header bytes flipped": bytes(flipped),
        "not arrow at all": b'{"pid": "d1#0", "queries": ["q"]}\n' * 50,
        "zeros": bytes(len(data)),
    }


@pytest.mark.parametrize("damage", ["cut in the schema", "cut in a batch", "last byte missing",
                                    "header bytes flipped", "not arrow at all", "zeros"])
@pytest.mark.parametrize("reader", ["open_mapped", "scan_tables", "iter_records"])
def test_a_damaged_arrow_file_names_itself_and_the_stage_that_rebuilds_it(tmp_path, damage, reader):
    good, damaged = corrupted_files(tmp_path)
    good.write_bytes(damaged[damage])
    read = {"open_mapped": lambda: open_mapped(good, QUERIES_SCHEMA),
            "scan_tables": lambda: list(scan_tables(good, QUERIES_SCHEMA, 500)),
            "iter_records": lambda: list(iter_records(good, QUERIES_SCHEMA))}[reader]
    with pytest.raises(DataFormatError) as caught:
        read()
    assert caught.value.path == str(good)
    assert "generate_queries" in str(caught.value) and "damaged" in str(caught.value)
    assert "`dvc repro -s -f profiles/smoke/dvc.yaml:generate_queries`" in str(caught.value)
