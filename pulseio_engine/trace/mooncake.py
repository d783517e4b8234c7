"""Mooncake traces (kvcache-ai/Mooncake, FAST'25): JSONL, one request per line, sorted by arrival.

    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, ...]}

`timestamp` is the arrival in ms from the trace's start, `input_length` / `output_length` are token counts,
`hash_ids` name the prompt's 512-token prefix blocks (read for validity, unused here). A line that is not
such a record is an error naming the file and the line; nothing is skipped.
"""

from __future__ import annotations

import json
from pathlib import Path

from .records import Trace, TraceError, TraceRequest

FIELDS = ("timestamp", "input_length", "output_length")


def read_mooncake(path: Path, *, source: str | None = None) -> Trace:
    """Every request of a Mooncake JSONL file, in file order (which must be arrival order)."""
    requests: list[TraceRequest] = []
    last_ms = 0
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    while lines and not lines[-1].strip():
        lines.pop()                                  # the file's final newline(s)
    for number, line in enumerate(lines, start=1):
        where = f"{path}:{number}"
        record = _parse(line, where)
        ms = record["timestamp"]
        if ms < last_ms:
            raise TraceError(f"{where}: timestamp {ms} ms is earlier than the line before ({last_ms} ms); a Mooncake "
                             "trace lists requests in arrival order")
        last_ms = ms
        requests.append(TraceRequest(ms / 1e3, record["input_length"], record["output_length"],
                                     f"{path.name}:{number}"))
    if not requests:
        raise TraceError(f"{path}: no requests; a Mooncake trace has one JSON object per line")
    return Trace(tuple(requests), source or str(path), "mooncake", (f"read {len(requests)} requests from {path}",))


def _parse(line: str, where: str) -> dict:
    if not line.strip():
        raise TraceError(f"{where}: empty line; a Mooncake trace has one JSON object per line")
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: not JSON ({exc.msg} at column {exc.colno}): {line[:80]!r}") from None
    if not isinstance(record, dict):
        raise TraceError(f"{where}: a JSON {type(record).__name__}, expected an object with {', '.join(FIELDS)}")
    missing = [k for k in FIELDS if k not in record]
    if missing:
        raise TraceError(f"{where}: no {', '.join(missing)}; a Mooncake record has {', '.join(FIELDS)}")
    for key, least in (("timestamp", 0), ("input_length", 1), ("output_length", 1)):
        value = record[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise TraceError(f"{where}: {key} must be an integer >= {least}, got {value!r}")
    ids = record.get("hash_ids", [])
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise TraceError(f"{where}: hash_ids must be a list of integers, got {str(ids)[:60]}")
    return record
