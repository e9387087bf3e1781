"""The mode plan against measurement: for every shipped spec, regime and distinct mixer, the time of
the mode the calibrated plan chooses and of the mode the cost model alone chooses, each over the
fastest mode measured in the same run (1.00 = the fastest; target <= 1.5 for the calibrated plan).

    python benchmarks/plan.py                    # inference B1 at L 1024, training B 8 at L 512
    python benchmarks/plan.py --length 256 --batch 32 --specs gateloop lru

Each row calibrates (a fresh cache in a temporary directory), plans, then measures every valid mode
again, interleaved, median of up to five runs (:func:`attnspec.compiler.calibrate.check_plan`,
which the test ``tests/compiler/test_calibrate.py`` runs too). Modes run at full length even where
the calibration would skip them as predicted far slower, so the cost model's choice always has a
ratio; only modes estimated to move over 2 GiB are not run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from attnspec.compiler.calibrate import check_plan  # noqa: E402
from attnspec.compiler.calibration import Calibration  # noqa: E402
from attnspec.spec import load_spec  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=None, help="one length for both regimes")
    parser.add_argument("--batch", type=int, default=8, help="training micro-batch")
    parser.add_argument("--specs", nargs="*", default=None, help="shipped spec names (default: all)")
    args = parser.parse_args()
    names = args.specs or sorted(path.stem for path in (ROOT / "specs").glob("*.yaml"))
    regimes = [("inference", 1, args.length or 1024), ("training", args.batch, args.length or 512)]
    table = Table(title="chosen mode / fastest measured mode, same run")
    for column in ("spec", "layer", "regime", "calibrated", "ratio", "cost model", "ratio", "fastest", "measured"):
        table.add_column(column)
    with tempfile.TemporaryDirectory() as cache:
        calibration = Calibration(Path(cache) / "calibration.json", {}, "benchmark")
        for name in names:
            spec = load_spec(ROOT / "specs" / f"{name}.yaml", ())
            for regime, batch, length in regimes:
                length = min(length, spec.max_len)
                for check in check_plan(spec, regime=regime, batch=batch, length=length, calibration=calibration,
                                        skip_slow=False):
                    ratio = lambda mode: "-" if check.ratio(mode) is None else f"{check.ratio(mode):.2f}"  # noqa: E731
                    measured = ", ".join(f"{mode} {seconds * 1e3:.1f} ms" for mode, seconds in check.seconds.items())
                    table.add_row(name, check.path.split(" ")[0], f"{regime} B{batch} L{length}", check.chosen,
                                  ratio(check.chosen), check.estimated, ratio(check.estimated), check.fastest, measured)
                    Console().print(f"{name} {regime}: calibrated {check.chosen} {ratio(check.chosen)}, "
                                    f"cost model {check.estimated} {ratio(check.estimated)}", highlight=False)
    Console().print(table)


if __name__ == "__main__":
    main()
