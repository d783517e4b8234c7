"""Request lifecycle on the host: sampling parameters, the sequence state machine, results.

CPU-only bookkeeping: no torch. A `Sequence` knows its tokens, how many of them already have KV in
the cache (`num_computed`), and its block table; the scheduler moves it WAITING -> RUNNING -> FINISHED.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .kv.block_table import BlockTable

PENDING_TOKEN = -1      # a generated token whose value is still on the device (`Engine.advance_decode`)


class Status(Enum):
    WAITING = "waiting"      # queued, no KV blocks yet
    RUNNING = "running"      # blocks allocated; prefilling or decoding
    FINISHED = "finished"    # blocks returned


class FinishReason(Enum):
    """Why a request stopped generating."""

    LENGTH = "length"        # max_new_tokens reached
    EOS = "eos"              # an end-of-sequence token was sampled


_TRANSITIONS = {
    Status.WAITING: {Status.RUNNING},
    Status.RUNNING: {Status.FINISHED},
    Status.FINISHED: set(),
}


@dataclass(frozen=True)
class SamplingParams:
    """`temperature == 0` is greedy (the default)."""

    max_new_tokens: int = 32
    temperature: float = 0.0
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        if not self.temperature >= 0.0:
            raise ValueError(f"SamplingParams.temperature must be >= 0 (0 = greedy), got {self.temperature!r}")


@dataclass(frozen=True)
class RequestOutput:
    """What a finished (or stepped) request returns: ids, text and why it stopped."""

    request_id: int
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    finish_reason: FinishReason


class Sequence:
    """One request's mutable state. `token_ids` = prompt + generated; KV exists for the first
    `num_computed` of them. The last token never has KV until the next forward consumes it.
    The last `decode_tail` prompt tokens are not prefilled but fed one per decode step (as an
    evaluation decodes its question); the log-probability each step gave the prompt token that follows
    it is kept in `forced_logprobs`."""

    def __init__(self, request_id: int, prompt_ids: list[int], sampling: SamplingParams,
                 *, eos_token_ids: tuple[int, ...] = (), num_computed: int = 0, decode_tail: int = 0) -> None:
        if not prompt_ids:
            raise ValueError(f"request {request_id}: prompt_ids must not be empty")
        if not 0 <= num_computed < len(prompt_ids):
            raise ValueError(
                f"request {request_id}: handed-in KV covers {num_computed} tokens but the prompt has "
                f"{len(prompt_ids)}; it must cover fewer tokens than the prompt, so that at least the "
                f"last token (e.g. the first token the prefill instance sampled) is left to feed"
            )
        if not 0 <= decode_tail < len(prompt_ids) - num_computed:
            raise ValueError(f"request {request_id}: decode_tail={decode_tail} must be in [0, "
                             f"{len(prompt_ids) - num_computed}): at least one prompt token is prefilled")
        self.request_id = request_id
        self.prefill_stop = len(prompt_ids) - decode_tail   # prefill covers [0, prefill_stop)
        self.forced_logprobs: list[float] = []
        self.token_ids: list[int] = list(prompt_ids)
        self.prompt_len = len(prompt_ids)
        self.sampling = sampling
        self.eos_token_ids = () if sampling.ignore_eos else eos_token_ids
        self.num_computed = num_computed
        self.block_table = BlockTable()
        self.status = Status.WAITING
        self.finish_reason: FinishReason | None = None

    def __repr__(self) -> str:
        return (f"Sequence(id={self.request_id}, {self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed})")

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def max_len(self) -> int:
        """Tokens this sequence may hold at most: prompt + max_new_tokens."""
        return self.prompt_len + self.sampling.max_new_tokens

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len:]

    def set_status(self, new: Status) -> None:
        if new not in _TRANSITIONS[self.status]:
            raise RuntimeError(f"request {self.request_id}: illegal transition {self.status} -> {new}"
                               " (this is a bug in pulseio_engine)")
        self.status = new

    def mark_computed(self, num_tokens: int) -> None:
        if not 0 < num_tokens <= self.num_uncomputed:
            raise RuntimeError(f"request {self.request_id}: cannot mark {num_tokens} tokens computed "
                               f"with {self.num_uncomputed} uncomputed (this is a bug in pulseio_engine)")
        self.num_computed += num_tokens

    def append_token(self, token_id: int) -> FinishReason | None:
        """Add a sampled token; returns why the sequence is now done, or None."""
        self.token_ids.append(token_id)
        if token_id in self.eos_token_ids:
            self.finish_reason = FinishReason.EOS
        elif len(self.output_ids) >= self.sampling.max_new_tokens:
            self.finish_reason = FinishReason.LENGTH
        return self.finish_reason

    def to_output(self) -> RequestOutput:
        if self.finish_reason is None:
            raise RuntimeError(f"request {self.request_id} is not finished")
        return RequestOutput(self.request_id, tuple(self.token_ids[:self.prompt_len]),
                             tuple(self.output_ids), self.finish_reason)
