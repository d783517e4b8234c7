"""Tokenizers: bytes for random-weight presets, Hugging Face's for checkpoints (built by
`transformers` from tokenizer files or from a GGUF's embedded vocabulary; imported lazily)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class Tokenizer(Protocol):
    eos_token_ids: tuple[int, ...]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255; larger ids (a random model may sample them) decode to nothing."""

    eos_token_ids: tuple[int, ...] = ()

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    def __init__(self, tokenizer, eos_token_ids: tuple[int, ...]) -> None:  # noqa: ANN001 (transformers type)
        self._tok = tokenizer
        self.eos_token_ids = eos_token_ids

    @classmethod
    def from_dir(cls, path: Path, eos_token_ids: tuple[int, ...]) -> HFTokenizer:
        return cls(_auto_tokenizer()(str(path)), eos_token_ids)

    @classmethod
    def from_gguf(cls, path: Path, eos_token_ids: tuple[int, ...]) -> HFTokenizer:
        """Built from the file's vocabulary (~4 s for SmolLM2), then kept as tokenizer files in
        `<file>.tokenizer/` when that folder can be written, which later runs read in ~0.1 s."""
        cache, stamp = _tokenizer_cache(path)
        if (cache / "stamp").is_file() and (cache / "stamp").read_text() == stamp:
            return cls(_auto_tokenizer()(str(cache)), eos_token_ids)
        tokenizer = _auto_tokenizer()(str(path.parent), gguf_file=path.name)
        try:
            tokenizer.save_pretrained(str(cache))
            (cache / "stamp").write_text(stamp)
        except OSError:
            pass   # a read-only folder: the next run converts again, nothing else differs
        return cls(tokenizer, eos_token_ids)

    def encode(self, text: str) -> list[int]:
        return list(self._tok(text)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)


def _tokenizer_cache(path: Path) -> tuple[Path, str]:
    """(folder, stamp): the stamp names the file's size and mtime, so a replaced file is converted again."""
    st = path.stat()
    return path.with_name(path.name + ".tokenizer"), f"{path.name} {st.st_size} {st.st_mtime_ns}"


def has_tokenizer_files(path: Path) -> bool:
    return any((path / name).exists() for name in ("tokenizer.json", "tokenizer.model", "vocab.json"))


def _auto_tokenizer():  # noqa: ANN202
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ImportError("reading a checkpoint's tokenizer needs the `transformers` package "
                          "(pip install 'pulseio[test]'); pass --prompt-ids to skip tokenization") from exc
    return AutoTokenizer.from_pretrained
