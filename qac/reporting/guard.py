"""A tracked report is never replaced by one built from outputs that are not there.

``reports/<profile>/`` is committed: it is the result of a run someone made,
perhaps on another machine. Rebuilding it where the profile's DVC outputs are
absent (a fresh clone, a profile that never ran here, a deleted folder) would
turn every number into ``n/a`` and delete the figures. Before the report is
written, :func:`check_replaceable` compares the new tables with the committed
CSVs: when a cell that holds a number there would lose it because the file
behind it is missing, or when the outputs hold no number at all, it refuses
with one paragraph naming the missing files and the DVC stages that write
them, and the report on disk stays as it is.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Iterable, Mapping

from qac.errors import UserError
from qac.pipeline_plan import stage_writing

SHOWN = 4   # missing files named in the message; the rest are counted


class MissingOutputs(UserError):
    """The report would be built from outputs that do not exist."""


def _committed_sources(report_dir: Path) -> dict[tuple[str, str, str], str]:
    """``(table, row, column) -> source`` of every cell with a number in the report on disk."""
    found: dict[tuple[str, str, str], str] = {}
    for path in sorted(report_dir.glob("table*.csv")):
        try:
            with path.open(encoding="utf-8", newline="") as handle:
                for line in csv.DictReader(handle):
                    if line.get("ours") and line.get("source"):
                        found[(line["table"], line["row"], line["column"])] = line["source"]
        except (OSError, UnicodeDecodeError, csv.Error):
            continue    # an unreadable old report protects nothing; the new one replaces it
    return found


def stages_writing(paths: Iterable[str], profile: str) -> list[str]:
    """The DVC stages (``prepare@scifact``, ``evaluate@cocondenser-passage``) whose outputs hold ``paths``,
    relative to ``data/<profile>/``."""
    found: list[str] = []
    for path in paths:
        writer = stage_writing(f"data/{profile}/{path}")
        if writer and writer[1] not in found:
            found.append(writer[1])
    return found


def check_replaceable(report_dir: str | Path, data_root: str | Path, profile: str,
                      new_values: Mapping[tuple[str, str, str], float | None]) -> None:
    """Refuse (:class:`MissingOutputs`) to replace ``report_dir`` from outputs under ``data_root`` that are missing.

    ``new_values`` maps ``(table, row, column)`` to the new report's number (None: n/a; a cell it lacks is a row
    the new report drops, as it drops a variant with no outputs).
    """
    report_dir, data_root = Path(report_dir), Path(data_root)
    lost = {key: source for key, source in _committed_sources(report_dir).items()
            if new_values.get(key) is None and not (data_root / source).exists()}
    if not lost and any(value is not None for value in new_values.values()):
        return
    command = f"dvc repro profiles/{profile}/dvc.yaml"
    kept = f"{report_dir}/ is left as it is" if report_dir.exists() else "nothing was written"
    if not lost:
        what = (f"{data_root} is a file, not a profile's data folder" if data_root.is_file()
                else f"{data_root}/ does not exist" if not data_root.is_dir()
                else f"{data_root}/ holds none of the evaluation outputs the tables are built from")
        also = ", or `make smoke`" if profile == "smoke" else ""
        raise MissingOutputs(f"no results to report for profile '{profile}': {what}. Run the profile first "
                             f"(`{command}`{also}); {kept}.")
    missing = sorted(set(lost.values()))
    shown = ", ".join(f"{data_root}/{path}" for path in missing[:SHOWN])
    more = f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else ""
    stages = stages_writing(missing, profile)
    rerun = (f"Run the stage{'s' if len(stages) > 1 else ''} that write{'' if len(stages) > 1 else 's'} "
             f"{'them' if len(missing) > 1 else 'it'}, {', '.join(stages)} (`{command}` runs "
             f"{'them' if len(stages) > 1 else 'it'} and what {'they need' if len(stages) > 1 else 'it needs'})"
             if stages else f"Run the profile (`{command}`)")
    plural = len(lost) > 1
    raise MissingOutputs(
        f"{len(lost)} number{'s' if plural else ''} of the committed report {report_dir}/ would become n/a "
        f"because the output{'s' if len(missing) > 1 else ''} behind {'them' if plural else 'it'} "
        f"{'are' if len(missing) > 1 else 'is'} missing: {shown}{more}. {rerun}, then build the tables again; "
        f"{kept} (delete it first to build a report from what there is).")
