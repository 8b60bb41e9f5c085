"""Resumable, sharded query generation over a passages file.

The unit of work is a *chunk*: ``chunk_size`` consecutive rows of
``passages.arrow`` (memory-mapped: a shard reads only its own chunks' rows). Chunk ``k`` belongs to shard ``k mod n``, so any number of
processes (torchrun ranks, or separate machines with ``--shard i/n``) split the
corpus without talking to each other, and a chunk's batches are the same
whichever process runs it. Each finished chunk is committed atomically to a
work directory beside the output:

```
data/<profile>/.queries.work/<fingerprint>/
    manifest.json            what the chunks were generated from (inputs, settings)
    chunks/000012.jsonl      the chunk's output records, one JSON line per passage
    chunks/000012.json       commit marker: md5 and line count of the .jsonl, counts
```

The fingerprint hashes the inputs (passages and generator MD5) and every
setting that changes the output, so a changed configuration never picks up
stale chunks. A rerun after a crash (even ``kill -9``) skips committed chunks;
the merge streams the chunks in order into ``queries.arrow``
(:mod:`qac.data.arrowstore`, fixed batch boundaries), so the result is
byte-identical to an uninterrupted run.

``queries.arrow``: one row per passage, row i for row i of ``passages.arrow``
(the first ``querygen.max_passages`` of them when that is set): ``pid``
(``<doc_id>#<k>``) and ``queries`` (list of strings) in generation order
(candidate 0 first), after dropping empty and repeated candidates when
configured.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from qac.data.arrowstore import PASSAGES_SCHEMA, open_mapped, open_passages, write_queries
from qac.data.errors import DataFormatError
from qac.io import atomic_path, file_md5, path_md5, write_json
from qac.querygen.generate import GenerationStats, QueryGenerator, SamplingSettings
from qac.data.tokens import TokenizerStamp

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class ShardSpec:
    """Shard ``index`` of ``count``: the chunks ``k`` with ``k % count == index``."""

    index: int = 0
    count: int = 1

    def __post_init__(self):
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"shard {self.index}/{self.count}: need 0 <= index < count")

    @classmethod
    def parse(cls, text: str) -> "ShardSpec":
        """``"i/n"`` (0-based ``i``)."""
        try:
            index, count = (int(part) for part in text.split("/"))
        except ValueError:
            raise ValueError(f"--shard expects i/n with integers (e.g. 0/4), got {text!r}") from None
        return cls(index, count)

    def within(self, rank: int, world_size: int) -> "ShardSpec":
        """Split this shard further among ``world_size`` torchrun ranks."""
        return ShardSpec(self.index * world_size + rank, self.count * world_size)

    def owns(self, chunk: int) -> bool:
        return chunk % self.count == self.index


def work_dir_for(output: str | os.PathLike) -> Path:
    """``data/<profile>/.queries.work`` for ``data/<profile>/queries.arrow``: not a DVC output."""
    output = Path(output)
    return output.parent / f".{output.stem}.work"


def fingerprint(fields: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of ``fields``."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def count_passages(path: str | os.PathLike) -> int:
    """Number of rows of a passages file."""
    return open_passages(path).num_rows


def iter_chunks(path: str | os.PathLike, chunk_size: int, wanted: Callable[[int], bool],
                limit: int | None = None) -> Iterator[tuple[int, list[tuple[str, str]]]]:
    """Yield ``(chunk index, [(pid, text), ...])`` for the chunks ``wanted`` accepts.

    Other chunks are skipped without reading them (the file is memory-mapped),
    and a read chunk's pages are released once its texts are decoded.
    ``limit`` stops after that many passages.
    """
    mapped = open_mapped(path, PASSAGES_SCHEMA)
    table = mapped.table.select(["pid", "text"])
    total = table.num_rows if limit is None else min(limit, table.num_rows)
    for chunk, start in enumerate(range(0, total, chunk_size)):
        if not wanted(chunk):
            continue
        part = table.slice(start, min(chunk_size, total - start))
        passages = list(zip(part.column("pid").to_pylist(), part.column("text").to_pylist()))
        mapped.release()
        for offset, (pid, _) in enumerate(passages):
            if not pid:
                raise DataFormatError(path, start + offset + 1, "pid", "empty")
        yield chunk, passages


def _query_line(pid: str, queries: list[str]) -> str:
    return json.dumps({"pid": pid, "queries": queries}, ensure_ascii=False) + "\n"


def _read_json_object(path: Path) -> dict | None:
    """The JSON object in ``path``; None when it is missing or cannot be read as one (a disk fault, a copy
    cut short): a chunk's marker or the store's manifest is then written again, never trusted."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


class ChunkStore:
    """Committed chunks of one configuration (one fingerprint) under a work directory."""

    def __init__(self, work_dir: str | os.PathLike, manifest: Mapping[str, Any]):
        self.work_dir = Path(work_dir)
        self.manifest = dict(manifest)
        self.root = self.work_dir / self.manifest["fingerprint"][:16]
        self.chunks_dir = self.root / "chunks"

    def prepare(self) -> None:
        """Create the store, drop stores of other configurations, write or check the manifest.

        Safe to call from several processes of the same configuration at once.
        """
        self.chunks_dir.mkdir(parents=True, exist_ok=True)
        for other in self.work_dir.iterdir():
            if other.is_dir() and other != self.root and not other.name.startswith("."):
                shutil.rmtree(other, ignore_errors=True)
        path = self.root / MANIFEST
        existing = _read_json_object(path)
        if existing is not None:
            if existing.get("fingerprint") != self.manifest["fingerprint"]:
                raise RuntimeError(f"{path}: fingerprint {existing.get('fingerprint')} does not match "
                                   f"{self.manifest['fingerprint']}; remove {self.work_dir}")
        else:
            write_json(path, self.manifest)

    def _paths(self, chunk: int) -> tuple[Path, Path]:
        stem = self.chunks_dir / f"{chunk:06d}"
        return stem.with_suffix(".jsonl"), stem.with_suffix(".json")

    def marker(self, chunk: int) -> dict | None:
        """The commit marker of ``chunk`` if the chunk is complete and intact, else None."""
        data_path, marker_path = self._paths(chunk)
        if not marker_path.exists() or not data_path.exists():
            return None
        marker = _read_json_object(marker_path)      # a damaged marker: the chunk is generated again
        if marker is None or file_md5(data_path) != marker.get("md5"):
            return None
        return marker

    def committed(self) -> list[int]:
        return sorted(int(p.stem) for p in self.chunks_dir.glob("*.json") if self.marker(int(p.stem)) is not None)

    def commit(self, chunk: int, pids: list[str], queries: list[list[str]], stats: GenerationStats) -> None:
        """Write a chunk's lines, then its marker; both atomically, the marker last."""
        data_path, marker_path = self._paths(chunk)
        with atomic_path(data_path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
            for pid, texts in zip(pids, queries):
                handle.write(_query_line(pid, texts))
        write_json(marker_path, {"chunk": chunk, "passages": len(pids), "first_pid": pids[0], "last_pid": pids[-1],
                                 "md5": file_md5(data_path), "stats": stats.as_dict()})

    def merge(self, output: str | os.PathLike, tokenizer=None, tokenizer_name: str | None = None) -> GenerationStats:
        """Concatenate every chunk in order into ``output`` (atomically); the summed counts.

        With ``tokenizer`` each query's token ids are stored beside it (qac.data.tokens).
        Fails, writing nothing, when a chunk is missing or its size disagrees with the manifest.
        """
        n_chunks, chunk_size = self.manifest["chunks"], self.manifest["chunk_size"]
        missing = [k for k in range(n_chunks) if self.marker(k) is None]
        if missing:
            shown = ", ".join(str(k) for k in missing[:10]) + (" ..." if len(missing) > 10 else "")
            raise RuntimeError(f"{self.root}: {len(missing)} of {n_chunks} chunks not generated yet ({shown}); "
                               "run the remaining shards before merging")
        total = GenerationStats()
        for chunk in range(n_chunks):    # every marker checked before anything is written
            marker = self.marker(chunk)
            expected = min(chunk_size, self.manifest["passages"] - chunk * chunk_size)
            if marker["passages"] != expected:
                raise RuntimeError(f"{self._paths(chunk)[1]}: {marker['passages']} passages, expected {expected}")
            total.add(GenerationStats.from_dict(marker["stats"]))

        def records() -> Iterator[dict]:
            for chunk in range(n_chunks):
                with open(self._paths(chunk)[0], encoding="utf-8") as handle:
                    for line in handle:
                        yield json.loads(line)

        write_queries(output, records(), tokenizer=tokenizer, tokenizer_name=tokenizer_name)
        return total

    def remove(self) -> None:
        shutil.rmtree(self.work_dir, ignore_errors=True)


def passages_tokenizer(passages_path: str | os.PathLike):
    """``(tokenizer, spec)`` that made the token ids of ``passages.arrow`` (None, None when it holds none):
    queries get their ids from the same tokenizer, so pairs are of one vocabulary."""
    # here, not at the top: it loads safetensors
    from qac.data.tokenizer import load_tokenizer

    stamp = TokenizerStamp.from_schema(open_mapped(passages_path, PASSAGES_SCHEMA).table.schema)
    if stamp is None:
        return None, None
    return load_tokenizer(stamp.name), stamp.name


def build_manifest(passages_path: str | os.PathLike, generator_source: str, settings: SamplingSettings,
                   chunk_size: int, compute: Mapping[str, Any], max_passages: int | None = None) -> dict[str, Any]:
    """What a set of chunks is generated from; ``compute`` names precision and invariance settings.

    ``max_passages`` limits generation to the first passages of the file (null: all).
    """
    if chunk_size < 1:
        raise ValueError(f"querygen.chunk_size must be >= 1, got {chunk_size}")
    passages = count_passages(passages_path)
    if max_passages is not None:
        passages = min(passages, int(max_passages))
    if passages == 0:
        raise ValueError(f"{passages_path}: no passages")
    source = Path(generator_source)
    fields = {
        "passages_md5": file_md5(passages_path),
        "generator": str(generator_source),
        "generator_md5": path_md5(source) if source.exists() else None,
        "settings": asdict(settings),
        "chunk_size": chunk_size,
        "max_passages": max_passages,
        "compute": dict(compute),
    }
    return {**fields, "fingerprint": fingerprint(fields), "passages": passages,
            "chunks": -(-passages // chunk_size)}


def generate_chunks(store: ChunkStore, generator: QueryGenerator, passages_path: str | os.PathLike,
                    shard: ShardSpec, batch_size: int,
                    progress: Callable[[int], None] | None = None) -> GenerationStats:
    """Generate and commit every uncommitted chunk of ``shard``; counts of what this call generated."""
    done = set(store.committed())
    todo = lambda k: shard.owns(k) and k not in done  # noqa: E731
    generated = GenerationStats()
    for chunk, passages in iter_chunks(passages_path, store.manifest["chunk_size"], todo,
                                       limit=store.manifest["passages"]):
        started = time.perf_counter()
        queries, stats = generator.generate(passages, batch_size, on_batch=progress)
        stats.seconds = time.perf_counter() - started
        store.commit(chunk, [pid for pid, _ in passages], queries, stats)
        generated.add(stats)
    return generated


def pending_passages(store: ChunkStore, shard: ShardSpec) -> int:
    """How many passages ``shard`` still has to generate (for a progress bar)."""
    done = set(store.committed())
    total, size, n = 0, store.manifest["chunk_size"], store.manifest["passages"]
    for chunk in range(store.manifest["chunks"]):
        if shard.owns(chunk) and chunk not in done:
            total += min(size, n - chunk * size)
    return total
