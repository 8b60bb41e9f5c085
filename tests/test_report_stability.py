"""The tracked report changes only when a value changes at its printed precision.

Two machines that reproduce every cell differ in the last bits of trained
outputs (float noise); the report must then be byte-identical, figures
included. The report's facts are read from the outputs, never typed, and its
text says what it means: no signed zero, a difference and its MDE at one
precision, plurals that agree, one colour per method.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from dvc_study import PARAMS, PROFILE, RAW_PARAMS, study_params, write_study
from qac.reporting.profile_report import write_report


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def with_float_noise(data: Path, relative: float = 1e-12) -> None:
    """Every per-query value and loss moved in its last bits, as another CPU moves them."""
    for path in data.rglob("*.per_query.json"):
        measures = json.loads(path.read_text(encoding="utf-8"))
        noisy = {measure: {qid: value * (1 + relative) + relative if isinstance(value, float) else value
                           for qid, value in values.items()} for measure, values in measures.items()}
        path.write_text(json.dumps(noisy), encoding="utf-8")
    for path in data.rglob("losses.tsv"):
        lines = path.read_text(encoding="utf-8").splitlines()
        header, rows = lines[0].split("\t"), [line.split("\t") for line in lines[1:]]
        noisy = ["\t".join(value if name == "step" else repr(float(value) * (1 + relative))
                           for name, value in zip(header, row)) for row in rows]
        path.write_text("\n".join([lines[0], *noisy]) + "\n", encoding="utf-8")


def test_float_noise_in_every_output_leaves_the_report_byte_identical(tmp_path):
    data = write_study(tmp_path / "data")
    write_report(PARAMS, tmp_path / "a", data)
    with_float_noise(data)
    write_report(PARAMS, tmp_path / "b", data)
    first, second = snapshot(tmp_path / "a" / PROFILE), snapshot(tmp_path / "b" / PROFILE)
    assert sorted(first) == sorted(second)
    assert [name for name in first if first[name] != second[name]] == []
    assert any(name.endswith(".png") for name in first)


def test_a_change_at_the_printed_precision_changes_the_report(tmp_path):
    data = write_study(tmp_path / "data")
    write_report(PARAMS, tmp_path / "a", data)
    bm25 = next((data / "bm25" / "runs").rglob("*.per_query.json"))
    measures = json.loads(bm25.read_text(encoding="utf-8"))
    measure = next(iter(measures))
    measures[measure] = {qid: min(1.0, value + 0.01) for qid, value in measures[measure].items()}
    bm25.write_text(json.dumps(measures), encoding="utf-8")
    write_report(PARAMS, tmp_path / "b", data)
    assert (tmp_path / "a" / PROFILE / "table1.csv").read_bytes() != (tmp_path / "b" / PROFILE / "table1.csv").read_bytes()


def png_chunks(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, offset = [], 8
    while offset < len(data):
        length, kind = struct.unpack(">I4s", data[offset:offset + 8])
        chunks.append((kind, data[offset + 8:offset + 8 + length]))
        offset += 12 + length
    return chunks


def test_figures_carry_no_software_version_and_no_date(tmp_path):
    data = write_study(tmp_path / "data")
    report = write_report(PARAMS, tmp_path / "out", data)
    figures = sorted((report.directory / "figures").glob("*.png"))
    assert figures
    for figure in figures:
        for kind, body in png_chunks(figure):
            assert kind != b"tIME"
            assert not (kind in (b"tEXt", b"iTXt", b"zTXt") and body.split(b"\0")[0] in (b"Software", b"Creation Time"))


def table(unit: str = "percent"):
    from qac.reporting.tables import Table

    return Table("table1", "T", unit, ["c"])


@pytest.mark.parametrize("unit, value, mde, p, shown", [
    ("percent", -0.0612, 0.1449, 0.26, "-0.06 (p=0.26; MDE 0.14)"),     # not "-0.1 ... MDE 0.1"
    ("percent", -0.0004, 0.21, 0.9, "0.00 (p=0.9; MDE 0.21)"),          # rounds to zero: no sign
    ("percent", 0.0004, None, 1.0, "0.00 (p=1)"),
    ("percent", 10.0, 4.0, 0.125, "+10.00 (p=0.12; MDE 4.00)"),
    ("fraction", -0.00004, 0.012, 0.5, "0.0000 (p=0.5; MDE 0.0120)"),
    ("fraction", 0.0123, 0.0101, 0.04, "+0.0123 (p=0.04; MDE 0.0101)"),
])
def test_a_difference_and_its_mde_print_at_one_precision_and_a_zero_has_no_sign(unit, value, mde, p, shown):
    from qac.reporting.precision import rounded_cell
    from qac.reporting.render import cell_text
    from qac.reporting.tables import Cell

    cell = rounded_cell(table(unit), "c", Cell(value=value, mde=mde, p_value=p, difference=True))
    assert cell_text(table(unit), "c", cell).split(" / ")[0] == shown


@pytest.mark.parametrize("unit, value, shown", [("percent", -0.04, "0.0"), ("percent", 2.95, "3.0"),
                                                ("fraction", 0.34126125943657276, "0.341")])
def test_a_value_prints_and_rounds_the_same_way(unit, value, shown):
    from qac.reporting.precision import rounded_cell
    from qac.reporting.render import cell_text, to_csv
    from qac.reporting.tables import Cell

    cell = rounded_cell(table(unit), "c", Cell(value=value))
    assert cell_text(table(unit), "c", cell).split(" / ")[0] == shown
    rows = to_csv(_table_with(unit, cell)).splitlines()
    assert float(rows[1].split(",")[4]) == float(shown)


def _table_with(unit, cell):
    result = table(unit)
    result.put("r", "c", cell)
    return result


def late_judged_dataset():
    """Twelve documents, two of the four judged ones far down the corpus, as SciFact's and Cranfield's judged
    documents are scattered far past the first N: a cut to the first N keeps few of them."""
    from qac.data.dataset import Dataset, Document

    corpus = {f"d{i}": Document(f"d{i}", "", f"text {i}") for i in range(1, 13)}
    qrels = {"test": {"q1": {"d2": 1, "d10": 1}, "q2": {"d11": 1}}, "train": {"q3": {"d3": 1}}}
    return Dataset("scifact", corpus, {"q1": "one", "q2": "two", "q3": "three"}, qrels, meta={"skipped": {}})


@pytest.mark.parametrize("max_documents, keep_judged, told", [
    # four judged documents and room for two: none of the first two survives
    (2, True, "4 of 12 documents: the 4 judged ones only (prepare.max_documents 2 leaves room for no other)"),
    (6, True, "6 of 12 documents: the 4 judged ones and the first 2 unjudged ones"),
    (6, False, "6 of 12 documents: the first 6"),
    (None, True, "12 documents"),
])
def test_the_header_says_what_the_prepared_corpus_kept(tmp_path, max_documents, keep_judged, told):
    from qac.data.prepared import prepare_dataset, write_prepared

    data = write_study(tmp_path / "data")
    dataset = prepare_dataset(late_judged_dataset(), max_documents=max_documents, keep_judged_documents=keep_judged)
    write_prepared(dataset, data / "datasets" / "scifact")
    params = study_params(prepare={"max_documents": max_documents, "keep_judged_documents": keep_judged})
    header = dict(write_report(params, tmp_path / "out", data).header)["Data"]
    assert f"scifact (beir; splits train, test; {told})" in header
    assert "the first 2 and every judged one" not in header and "the first 6 and every judged one" not in header


def test_the_header_says_what_an_mde_is_and_never_that_a_delta_below_it_is_noise(tmp_path):
    """The MDE is the design's power: the test on these queries tells an observed Δ below its MDE from zero."""
    from qac.evaluation.significance import ALPHA, compare_paired

    # 100 queries: half gain 0.125, half lose 0.075; mean 0.025, sd 0.1, t = 2.5 (between z_0.975 and z + z_0.8)
    with_values = {f"q{i}": 0.5 + (0.125 if i % 2 else -0.075) for i in range(100)}
    without_values = {f"q{i}": 0.5 for i in range(100)}
    result = compare_paired(with_values, without_values, permutations=2000, seed=0)
    delta = sum(with_values[q] - without_values[q] for q in with_values) / 100
    assert result.p_value < ALPHA and delta < result.mde                # significant, yet below its MDE
    data = write_study(tmp_path / "data")
    differences = dict(write_report(PARAMS, tmp_path / "out", data).header)["Differences"]
    assert "cannot tell from noise" not in differences and "below its MDE is one" not in differences
    assert "describes the design's power, not the observed Δ" in differences
    assert f"a Δ below its MDE can still have p < {ALPHA:g}" in differences


def _our_decimals(cell: str) -> list[int]:
    """Decimals of each number of ours in a Markdown cell (``ours / paper``): the value, its seed spread, its MDE."""
    import re

    ours = cell.split(" / ")[0]
    numbers = re.findall(r"^[+-]?\d+\.(\d+)", ours) + re.findall(r"±(?:\d+)\.(\d+)", ours)
    numbers += re.findall(r"MDE (?:\d+)\.(\d+)", ours)
    return [len(digits) for digits in numbers]


def test_a_row_prints_its_values_and_their_differences_at_one_precision(tmp_path):
    data = write_study(tmp_path / "data")
    text = (write_report(PARAMS, tmp_path / "out", data).directory / "tables.md").read_text(encoding="utf-8")
    mixed = 0
    for line in text.splitlines():
        if not line.startswith("| ") or line.startswith("| row |"):
            continue
        cells = line.strip("|").split(" | ")[1:]
        places = [places for cell in cells for places in _our_decimals(cell.strip())]
        assert len(set(places)) <= 1, line
        mixed += any(cell.strip().startswith(("+", "-")) for cell in cells) and any(
            cell.strip()[:1].isdigit() for cell in cells)
    assert mixed >= 2          # Table 2's dataset rows and Table 3's rows hold values beside their Δ


def test_counts_agree_with_their_nouns(tmp_path):
    data = write_study(tmp_path / "data")
    params = study_params(zero_shot=["nfcorpus"])
    text = (write_report(params, tmp_path / "out", data).directory / "tables.md").read_text(encoding="utf-8")
    assert "over the 1 dataset above" in text and "1 datasets" not in text


def test_table1_shows_the_zero_shot_retriever_only_where_the_profile_trains_it(tmp_path):
    from qac.reporting.lineage import load_study
    from qac.reporting.table_set import build_tables
    from qac.reporting.tables import RETRIEVER_LABELS

    data = write_study(tmp_path / "data")
    table1 = {t.key: t for t in build_tables(load_study(PARAMS, data), PARAMS)}["table1"]
    beir_rows = [row for row in table1.rows if RETRIEVER_LABELS["beir"] in row]
    assert beir_rows == []
    assert sum(RETRIEVER_LABELS["beir"] in note for note in table1.notes) == 1
    params = study_params(tables={**RAW_PARAMS["tables"], "zero_shot_retriever": "beir"})
    table1 = {t.key: t for t in build_tables(load_study(params, data), params)}["table1"]
    assert any(RETRIEVER_LABELS["beir"] in row for row in table1.rows)


def test_every_method_has_its_own_colour():
    from qac.reporting.figures import method_colour
    from qac.reporting.paper import METHOD_NAMES

    colours = [method_colour(method) for method in METHOD_NAMES]
    assert len(set(colours)) == len(colours)


def test_the_query_count_figure_draws_each_method_in_its_colour(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from qac.reporting import figures
    from qac.reporting.lineage import load_study
    from qac.reporting.table_set import build_tables

    data = write_study(tmp_path / "data")
    table3 = {t.key: t for t in build_tables(load_study(PARAMS, data), PARAMS)}["table3"]
    drawn = []
    monkeypatch.setattr(plt, "close", lambda figure: drawn.append(figure))    # keep the figure to look at
    figures.plot_query_count(table3, tmp_path / "q.png")
    lines = [line for axis in drawn[0].axes for line in axis.get_lines() if "query context" in line.get_label()]
    by_method = {line.get_label().split(" query context")[0]: line.get_color() for line in lines}
    assert len(by_method) >= 2 and len(set(by_method.values())) == len(by_method)
