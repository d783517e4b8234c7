"""benchmarks/read_ncu_source.py: the runs of equally executed instructions (loops against straight-line code) and
their share of the stall samples, on a source page written as Nsight Compute writes it."""

from __future__ import annotations

import csv
import gzip
import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "read_ncu_source.py"
_spec = importlib.util.spec_from_file_location("read_ncu_source", SCRIPT)
reader = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reader)   # type: ignore[union-attr]


def test_runs_split_a_loop_from_the_code_around_it() -> None:
    # 3 instructions once a warp (4 warps), a 4-instruction loop run 5 times, 2 instructions once
    executed = [4, 4, 4, 20, 20, 20, 20, 4, 4]
    samples = [1, 0, 1, 5, 3, 0, 4, 2, 4]
    assert reader.runs(executed, samples) == [(0, 2, 1.0, 0.1), (3, 6, 5.0, 0.6), (7, 8, 1.0, 0.3)]


def test_the_script_reads_a_gzipped_source_page(tmp_path: Path) -> None:
    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_wait",
              "stall_barrier", "stall_wait (Not Issued)"]
    rows = [["0x0", "MOV R1, R2", "2", "8", "2", "0", "2"],
            ["0x10", "BAR.SYNC 0x0", "6", "24", "0", "6", "0"],
            ["0x20", "EXIT", "0", "8", "0", "0", "0"]]
    page = tmp_path / "k.sass.csv.gz"
    with gzip.open(page, "wt", newline="") as f:
        writer = csv.writer(f, quoting=csv.QUOTE_ALL)
        writer.writerow(["Kernel Name", "k"])
        writer.writerow(header)
        writer.writerows(rows)
    out = subprocess.run([sys.executable, str(SCRIPT), str(page), "--top", "1"], capture_output=True, text=True,
                         check=True).stdout
    assert "3 instructions, 8 samples, 5 executed a warp" in out
    assert "stalls: barrier 75%, wait 25%" in out
    assert "    1-    1     1 x  3.00  75.0%" in out
    assert "BAR.SYNC 0x0" in out.split("top 1 instructions by samples:")[1]
