#!/usr/bin/env python3
"""`python benchmarks/results/locality-long-2026-12-05-cpu/join.py` from the repository root (run.sh ends with it):
join the shipped locality records: 2026-11-30's (2K-4K) and 2026-12-05's longer contexts (its 4K reruns, equal to
the shipped ones, stay out)."""
import json
from pathlib import Path
old = Path("benchmarks/results/locality-2026-11-30-cpu")
new = Path("benchmarks/results/locality-long-2026-12-05-cpu")
records = [json.loads(p.read_text()) for p in sorted(old.glob("*_*_*_*.json"))]
have = {(r["model"], r["mode"], r["context_len"], r["token_budget"]) for r in records}
for p in sorted(new.glob("*_*_*_*.json")):
    r = json.loads(p.read_text())
    key = (r["model"], r["mode"], r["context_len"], r["token_budget"])
    if key in have:
        continue
    records.append(r)
records.sort(key=lambda r: (r["model"], r["mode"], r["context_len"], r["token_budget"]))
data = {"about": "Step-to-step overlap of the middle blocks each offloaded layer selects, and the fraction of the "
                 "budget recalled per step, measured on real models decoding Shakespeare text on CPU "
                 "(see pulseio_engine/evaluation/locality.py for the definitions)",
        "command": "bash benchmarks/results/locality-2026-11-30-cpu/run.sh (2K-4K); "
                   "bash benchmarks/results/locality-long-2026-12-05-cpu/run.sh (8K-32K)", "records": records}
Path("pulseio_engine/data/locality.json").write_text(json.dumps(data, indent=1) + "\n")
print(f"{len(records)} records -> pulseio_engine/data/locality.json")
