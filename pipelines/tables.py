"""Stage `tables`: Tables 1-5 and the figures of the active profile, from MLflow runs.

Writes reports/<profile>/ (tables.md, table<N>.csv, table<N>.tex, figures/).
"""

from __future__ import annotations

import sys

from qac.config import load_params
from qac.reporting.report import write_report


def main() -> int:
    params = load_params()
    report = write_report(params, params.get("tables", {}).get("out_dir", "reports"))
    print(f"tables: wrote {report.directory}/tables.md ({len(report.tables)} tables, "
          f"{sum(reason is None for reason in report.figures.values())} figures)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
