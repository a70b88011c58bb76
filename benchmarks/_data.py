"""``--data DIR`` for every benchmark: where the shared data sets are (../shared/data/SOURCES.md names them).

The default is ``shared/data`` next to the repository (``../shared/data`` from its root); a benchmark that
reads a file there and does not find it stops with one line naming the folder and the option, never a
traceback. Benchmarks that read no data accept the option too, so one command line can drive them all.
"""

from __future__ import annotations

import sys
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def add_data_option(ap) -> None:
    ap.add_argument("--data", type=Path, default=DEFAULT, metavar="DIR",
                    help=f"folder of the shared data sets (default: ../shared/data next to the repository, "
                         f"here {DEFAULT})")


def data_file(data: Path, name: str) -> Path:
    """``data / name``, or exit 2 with one line saying what is missing and how to point at it."""
    path = Path(data) / name
    if not path.is_file():
        prog = Path(sys.argv[0]).name or "benchmark"
        where = "not in that folder" if Path(data).is_dir() else "no such folder"
        print(f"{prog}: error: {path} not found ({where}; give --data DIR, the folder with ../shared/data's "
              f"files)", file=sys.stderr)
        raise SystemExit(2)
    return path
