"""Arrow files between stages: passages and generated queries, memory-mapped.

The files that grow with the corpus (``passages.arrow``, ``queries.arrow``) are
Arrow IPC *stream* files, the format of Hugging Face ``datasets`` cache files:
``datasets.Dataset.from_file(path)`` opens one as a dataset, and
:func:`open_table` maps it into memory without reading it. Mapped pages live
in the operating system's page cache, so the processes of a ``torchrun`` job
share one copy of the texts instead of each holding its own.

A mapped page a process has touched counts in its resident memory until it is
unmapped, so two things keep that figure bounded on a corpus of any size
(:class:`MappedTable`): the mapping is advised ``MADV_RANDOM``, so a page fault
reads that page and not the megabytes around it (the kernel's read-around,
``read_ahead_kb``, would otherwise pull the whole file in while the stream's
batch headers are located), and long passes call :meth:`MappedTable.release`,
which drops the touched pages from the process (they stay in the page cache,
so touching them again costs a minor fault, not a read).

Writing is streaming (record batches of :data:`ROWS_PER_BATCH` rows, never
the whole table) and atomic (:func:`qac.io.atomic_path`). A batch boundary
depends only on the row count, so the same rows always give the same bytes,
whatever produced them in how many processes. The schemas are documented in
docs/architecture.md ("Files between stages").
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import pyarrow as pa

from qac.data.errors import DataFormatError
from qac.io import atomic_path
from qac.data.tokens import TextEncoder, TokenizerStamp
from qac.pipeline_plan import rerun_hint, restore_hint

ROWS_PER_BATCH = 1024
# Record batches located between two releases of their header pages when a file is opened.
_RELEASE_BATCHES = 64

PASSAGES_SCHEMA = pa.schema([
    pa.field("pid", pa.string(), nullable=False),
    pa.field("doc_id", pa.string(), nullable=False),
    pa.field("position", pa.int32(), nullable=False),
    pa.field("text", pa.string(), nullable=False),
    pa.field("n_tokens", pa.int32(), nullable=False),
    pa.field("contexts", pa.struct([
        pa.field("nearby", pa.list_(pa.string()), nullable=False),
        pa.field("random_sampled", pa.list_(pa.string()), nullable=False),
        pa.field("overlap", pa.string(), nullable=False),
    ]), nullable=False),
])

QUERIES_SCHEMA = pa.schema([
    pa.field("pid", pa.string(), nullable=False),
    pa.field("queries", pa.list_(pa.string()), nullable=False),
])

# Token ids written beside the texts (qac.data.tokens): without special tokens, untruncated;
# the file's schema metadata names the tokenizer. Readers that need no ids ignore them.
TOKEN_ID = pa.int32()
PASSAGE_ID_FIELDS = [
    pa.field("input_ids", pa.list_(TOKEN_ID), nullable=False),      # ids of `text`
    pa.field("overlap_ids", pa.list_(TOKEN_ID), nullable=False),    # ids of `contexts.overlap`
]
QUERY_ID_FIELDS = [
    pa.field("query_ids", pa.list_(pa.list_(TOKEN_ID)), nullable=False),   # ids of each of `queries`
]
PASSAGES_TOKENS_SCHEMA = pa.schema(list(PASSAGES_SCHEMA) + PASSAGE_ID_FIELDS)
QUERIES_TOKENS_SCHEMA = pa.schema(list(QUERIES_SCHEMA) + QUERY_ID_FIELDS)


class ArrowRecordWriter:
    """Append records (dicts) to an Arrow stream file in batches of ``ROWS_PER_BATCH`` rows.

    Use as a context manager: the file appears at ``path`` when the block ends
    without an error, and not at all otherwise.
    """

    def __init__(self, path: str | os.PathLike, schema: pa.Schema):
        self.path, self.schema = Path(path), schema
        self.rows = 0
        self._pending: list[dict[str, Any]] = []

    def __enter__(self) -> "ArrowRecordWriter":
        self._atomic = atomic_path(self.path)
        tmp = self._atomic.__enter__()
        self._sink = pa.OSFile(str(tmp), "wb")
        self._writer = pa.ipc.new_stream(self._sink, self.schema)
        return self

    def write(self, record: dict[str, Any]) -> None:
        self._pending.append(record)
        if len(self._pending) == ROWS_PER_BATCH:
            self._flush()

    def _flush(self) -> None:
        rows, self._pending = self._pending[:ROWS_PER_BATCH], self._pending[ROWS_PER_BATCH:]
        self._writer.write_batch(to_record_batch(rows, self.schema, self.path, first_row=self.rows))
        self.rows += len(rows)

    def __exit__(self, kind, error, traceback) -> bool:
        try:
            if kind is None:
                while self._pending:
                    self._flush()
            self._writer.close()
            self._sink.close()
        except BaseException as failure:
            self._atomic.__exit__(type(failure), failure, failure.__traceback__)
            raise
        return bool(self._atomic.__exit__(kind, error, traceback))


def to_record_batch(rows: list[dict[str, Any]], schema: pa.Schema, path, first_row: int = 0) -> pa.RecordBatch:
    """Rows as a record batch of ``schema``; a bad row raises naming the file, row and field."""
    batch = None
    if _lists_are_lists(rows, schema):   # Arrow would take a string as a list of characters
        try:
            batch = pa.RecordBatch.from_pylist(rows, schema=schema)
        except (pa.ArrowException, TypeError, ValueError):
            pass
    missing = [] if batch is None else [schema.field(i).name for i in range(len(schema))
                                        if batch.column(i).null_count]
    if batch is None or missing:
        for offset, row in enumerate(rows):
            _check_row(row, schema, path, first_row + offset)
        raise DataFormatError(path, None, missing[0] if missing else None, "cannot be stored as Arrow")
    return batch


def _list_fields(schema) -> list[tuple[str, ...]]:
    paths = []
    for field in schema:
        if pa.types.is_list(field.type):
            paths.append((field.name,))
        elif pa.types.is_struct(field.type):
            paths.extend((field.name, child.name) for child in field.type if pa.types.is_list(child.type))
    return paths


def _value(row: dict, path: tuple[str, ...]):
    for name in path:
        row = row.get(name) if isinstance(row, dict) else None
    return row


def _lists_are_lists(rows: list[dict[str, Any]], schema: pa.Schema) -> bool:
    paths = _list_fields(schema)
    return all(isinstance(_value(row, path), list) for row in rows for path in paths)


def _check_row(row: dict[str, Any], schema: pa.Schema, path, index: int) -> None:
    """Raise on the first field of ``row`` that ``schema`` cannot hold (``index`` counts from 1 in messages)."""
    for field in schema:
        if row.get(field.name) is None:
            raise DataFormatError(path, index + 1, field.name, "missing")
        try:
            pa.array([row[field.name]], type=field.type)
        except (pa.ArrowException, TypeError, ValueError) as error:
            raise DataFormatError(path, index + 1, field.name, f"expected {field.type} ({error})") from None
        if pa.types.is_struct(field.type):
            for child in field.type:
                if not isinstance(row[field.name], dict) or row[field.name].get(child.name) is None:
                    raise DataFormatError(path, index + 1, f"{field.name}.{child.name}", "missing")
    for list_path in _list_fields(schema):
        if not isinstance(_value(row, list_path), list):
            raise DataFormatError(path, index + 1, ".".join(list_path), "expected a list")


def write_records(path: str | os.PathLike, schema: pa.Schema, records: Iterable[dict[str, Any]]) -> int:
    """Write ``records`` as an Arrow stream file, atomically; the number of rows."""
    with ArrowRecordWriter(path, schema) as writer:
        for record in records:
            writer.write(record)
    return writer.rows


class MappedTable:
    """A memory-mapped Arrow stream file: its table and the mapping behind it.

    The table's columns point into the mapping; the mapping lives as long as
    any of its buffers does.
    """

    def __init__(self, path: Path, mapping: mmap.mmap, table: pa.Table | None):
        self.path, self.table = path, table
        self._mapping = mapping

    def release(self) -> None:
        """Drop the pages this process has touched from its resident memory.

        The mapping is read-only and shared, so ``MADV_DONTNEED`` discards
        nothing: the pages stay in the page cache, and a later access maps
        them again. Call it between the steps of a long pass.
        """
        if len(self._mapping):
            self._mapping.madvise(mmap.MADV_DONTNEED)


def unreadable(path: str | os.PathLike, error: BaseException) -> DataFormatError:
    """The error for an Arrow file that cannot be read (truncated, corrupted, not Arrow): the file, the
    reason, and how to restore or rebuild it."""
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return DataFormatError(path, None, None, f"not an Arrow stream file, or a truncated or corrupted "
                                             f"one ({reason}): the file is damaged; {restore_hint(path)}")


def damaged_batch(path: str | os.PathLike, error: BaseException, schema: pa.Schema, first: int,
                  end: int) -> DataFormatError:
    """The error for a record batch whose bytes do not hold together (an offset out of its buffer, a string
    that is not UTF-8): the file, the column and rows, and how to restore or rebuild the file."""
    import re

    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    column = re.search(r"[Cc]olumn (\d+)", reason)
    field = schema.field(int(column.group(1))).name if column and int(column.group(1)) < len(schema) else None
    return DataFormatError(path, None, field, f"the file is damaged: its bytes at rows {first + 1}-{end} do not "
                                              f"hold together ({reason}); {restore_hint(path)}")


def _schema_error(path: str | os.PathLike, field: str, problem: str) -> DataFormatError:
    """A column missing or of another type, with the stage that rebuilds the file (the plan is read
    only when a file is bad, so a stage that reads good files runs none of it)."""
    return DataFormatError(path, None, field, f"{problem}; {rerun_hint(path)}")


def _batches(path: str | os.PathLike, source) -> Iterator[pa.RecordBatch]:
    """The record batches of an Arrow stream, a read failure named as :func:`unreadable` names it."""
    try:
        yield from pa.ipc.open_stream(source)
    except (pa.ArrowException, OSError) as error:
        raise unreadable(path, error) from None


def open_mapped(path: str | os.PathLike, schema: pa.Schema) -> MappedTable:
    """Map an Arrow stream file (random-access advice, see the module text), checked against ``schema``."""
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(path, None, None, "file not found")
    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            raise unreadable(path, ValueError("empty file"))
        mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    mapping.madvise(mmap.MADV_RANDOM)
    mapped = MappedTable(path, mapping, None)
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(mapping))
        batches = []
        rows = 0
        for batch in reader:
            # Full validation: offsets inside their buffers and strings valid UTF-8, so a byte flipped in
            # the data is found here as a damaged file, not later as a decoding error or a crash.
            try:
                batch.validate(full=True)
            except pa.ArrowException as error:
                raise damaged_batch(path, error, batch.schema, rows, rows + batch.num_rows) from None
            rows += batch.num_rows
            batches.append(batch)
            # Locating a batch touches its header page, and the kernel maps the cached pages
            # around it (fault-around): per batch, not per byte, yet a number that grows with
            # the file; releasing as we go keeps the opening's footprint flat.
            if len(batches) % _RELEASE_BATCHES == 0:
                mapped.release()
        table = pa.Table.from_batches(batches, schema=reader.schema)
        table.validate()   # the batches agree with the schema: a corrupted header fails here, not mid-training
    except (pa.ArrowException, OSError) as error:   # invalid, truncated or unreadable: every Arrow error type
        raise unreadable(path, error) from None
    mapped.release()
    for field in schema:
        if field.name not in table.schema.names:
            raise _schema_error(path, field.name, "column missing")
        found = table.schema.field(field.name).type
        if not found.equals(field.type):
            raise _schema_error(path, field.name, f"expected {field.type}, found {found}")
    mapped.table = table
    return mapped


def open_table(path: str | os.PathLike, schema: pa.Schema) -> pa.Table:
    """The memory-mapped table of an Arrow stream file, checked against ``schema``.

    Reading costs no memory for the data itself: columns point into the
    mapping, and pages are loaded (and shared between processes) on access.
    """
    return open_mapped(path, schema).table


def iter_records(path: str | os.PathLike, schema: pa.Schema, columns: list[str] | None = None,
                 start: int = 0, stop: int | None = None) -> Iterator[dict[str, Any]]:
    """Rows ``start..stop`` of an Arrow stream file as dicts, decoded one batch at a time.

    The pages of each batch are released once it is decoded, so a pass over a
    file of any size keeps one batch resident.
    """
    mapped = open_mapped(path, schema)
    table = mapped.table if columns is None else mapped.table.select(columns)
    stop = table.num_rows if stop is None else min(stop, table.num_rows)
    for offset in range(start, stop, ROWS_PER_BATCH):
        records = table.slice(offset, min(ROWS_PER_BATCH, stop - offset)).to_pylist()
        mapped.release()
        yield from records


class RowGather:
    """Rows of a (memory-mapped) table by row number, touching only their record batches.

    ``Table.take`` concatenates every chunk of a column first, a copy of the
    whole file per call; here each requested row is looked up in its own
    record batch, so a batch of pairs costs what its rows weigh. Given the
    :class:`MappedTable`, the touched pages are released after every
    ``release_rows`` rows gathered, so sampling over many steps does not
    accumulate the file in the process's resident memory. The default is
    small because a row touches a page in each of its column buffers (about
    ten for a passage), and the kernel maps the cached pages around each
    fault too (fault-around, 64 kB by default): a row can bring ~0.5 MB.
    """

    def __init__(self, table: pa.Table, mapped: MappedTable | None = None, release_rows: int = 64):
        self.batches = table.to_batches()
        self.starts = np.cumsum([0] + [batch.num_rows for batch in self.batches])
        self._mapped, self._release_rows, self._since_release = mapped, release_rows, 0

    @property
    def num_rows(self) -> int:
        return int(self.starts[-1])

    def rows(self, rows, columns: list[str] | None = None) -> list[dict[str, Any]]:
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= self.num_rows):
            raise IndexError(f"row out of range 0..{self.num_rows - 1}")
        which = np.searchsorted(self.starts, rows, side="right") - 1
        found: list[Any] = [None] * len(rows)
        for index in np.unique(which).tolist():
            positions = np.flatnonzero(which == index)
            batch = self.batches[index] if columns is None else self.batches[index].select(columns)
            for position, record in zip(positions.tolist(),
                                        batch.take(pa.array(rows[positions] - self.starts[index])).to_pylist()):
                found[position] = record
            # decoded rows are Python objects now: their pages can go
            self._since_release += len(positions)
            if self._mapped is not None and self._since_release >= self._release_rows:
                self._mapped.release()
                self._since_release = 0
        return found


def scan_tables(path: str | os.PathLike, schema: pa.Schema, rows: int) -> Iterator[pa.Table]:
    """The file as consecutive tables of ``rows`` rows (the last may be shorter), read, not mapped.

    For one pass over a whole file: each table is read into the process and
    released after use, so the pass leaves no mapped pages resident in the
    process (a mapped scan would count the whole file in its resident memory).
    """
    open_table(path, schema)   # checks the schema, naming the file
    pending: list[pa.RecordBatch] = []
    buffered = 0
    with pa.OSFile(str(path), "rb") as source:
        for batch in _batches(path, source):
            pending.append(batch)
            buffered += batch.num_rows
            while buffered >= rows:
                table = pa.Table.from_batches(pending, schema=batch.schema)
                yield table.slice(0, rows)
                rest = table.slice(rows)
                pending, buffered = rest.to_batches(), rest.num_rows
        if buffered:
            yield pa.Table.from_batches(pending, schema=pending[0].schema)


def open_passages(path: str | os.PathLike) -> pa.Table:
    return open_table(path, PASSAGES_SCHEMA)


def open_queries(path: str | os.PathLike) -> pa.Table:
    return open_table(path, QUERIES_SCHEMA)


def write_passages(path: str | os.PathLike, records: Iterable[dict[str, Any]], tokenizer=None,
                   tokenizer_name: str | None = None) -> int:
    """Write ``passages.arrow``; with ``tokenizer``, also the token ids (computed where a record lacks them)."""
    if tokenizer is None:
        return write_records(path, PASSAGES_SCHEMA, records)

    encode = TextEncoder(tokenizer)

    def with_ids(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for key, texts in (("input_ids", [r["text"] for r in batch]),
                           ("overlap_ids", [(r.get("contexts") or {}).get("overlap") or "" for r in batch])):
            missing = [i for i, r in enumerate(batch) if key not in r]
            for i, ids in zip(missing, encode([texts[i] for i in missing])):
                batch[i][key] = ids
        return batch

    schema = PASSAGES_TOKENS_SCHEMA.with_metadata(TokenizerStamp.of(tokenizer, tokenizer_name).metadata())
    return write_records(path, schema, _in_batches(records, with_ids))


def write_queries(path: str | os.PathLike, records: Iterable[dict[str, Any]], tokenizer=None,
                  tokenizer_name: str | None = None) -> int:
    """Write ``queries.arrow``; with ``tokenizer``, also each query's token ids."""
    if tokenizer is None:
        return write_records(path, QUERIES_SCHEMA, records)

    encode = TextEncoder(tokenizer)

    def with_ids(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        flat = encode([query for record in batch for query in record["queries"]])
        start = 0
        for record in batch:
            record["query_ids"] = flat[start:start + len(record["queries"])]
            start += len(record["queries"])
        return batch

    schema = QUERIES_TOKENS_SCHEMA.with_metadata(TokenizerStamp.of(tokenizer, tokenizer_name).metadata())
    return write_records(path, schema, _in_batches(records, with_ids))


def _in_batches(records: Iterable[dict[str, Any]], transform) -> Iterator[dict[str, Any]]:
    """``records`` passed through ``transform`` a record batch's worth at a time (one tokenizer call each)."""
    pending: list[dict[str, Any]] = []
    for record in records:
        pending.append(dict(record))
        if len(pending) == ROWS_PER_BATCH:
            yield from transform(pending)
            pending = []
    if pending:
        yield from transform(pending)
