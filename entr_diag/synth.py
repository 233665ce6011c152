"""Seeded generator of per-token rollout logs with a KNOWN, planted ground truth.

Used by the tests and benchmarks of the scaling-law fit, the noise-regime breakpoint, the
gate simulator and the loader (arXiv:2607.22186, ENTR / ESTR). Every row is one generated
token in the canonical columns of ``METHOD.md``; one extra boolean column ``is_noise`` marks
the planted low-entropy noise tokens.

The planted model
=================

Notation: ``H`` entropy (nats), ``s = -infer_logprob`` the surprisal of the sampled token,
``p = exp(-s)`` its probability, ``delta = train_logprob - infer_logprob`` the log-ratio,
``staleness = train_version - policy_version``.

Sequences
    Lengths ``L ~ Geometric(1 / mean_seq_len)`` (support 1, 2, ...; mean ``mean_seq_len``);
    the last sequence is truncated so the file holds exactly ``n_tokens`` rows.
    ``seq_id`` is the 0-based global sequence index. ``step`` grows through the file:
    ``step = floor(n_steps * first_token_offset / n_tokens)``, so each step holds about
    ``n_tokens / n_steps`` tokens. ``train_version = step``. Each sequence draws a lag
    ``l ~ U{0..max_staleness}`` and ``policy_version = max(0, step - l)``.
    A share ``switch_share`` of the sequences has an in-flight weight switch at a position
    ``j ~ U{1..L-1}``: tokens from ``j`` on carry ``policy_version + 1``. A switch needs room
    (``policy_version < train_version`` and ``L >= 2``); switched sequences draw their lag in
    ``1..max_staleness``, and sequences without room (step 0, ``max_staleness == 0``,
    ``L == 1``) do not switch. The summary counts planted switches
    (``switched_sequences``) and those a loader can see, with valid tokens on both sides of
    the switch (``switched_sequences_visible``).
    ``advantage ~ Normal(0, 1)`` per sequence (GRPO-like, one value for all its tokens).

Entropy
    ``H`` is log-uniform on ``[h_min, h_max]``: ``log H ~ U(log h_min, log h_max)``.

Law tokens (every loss-masked token that is not a noise token)
    ``s = H * X`` with ``X ~ Exp(1)``, so ``E[s | H] = H`` (entropy is the expected surprisal
    of the sampled token): at low entropy ``p ~= 1 - H X``, at high entropy p is spread.
    ``delta = sigma(H) * Z``, ``Z ~ Normal(0, 1)``, with
    ``sigma(H)^2 = k * (1 + staleness_gain * staleness) * H**alpha``, hence EXACTLY

        E[delta^2 | H, staleness] = k * (1 + staleness_gain * staleness) * H**alpha

    (``staleness_gain = 0`` by default: the law is then staleness-independent, ``k H^alpha``).

Noise tokens (only where ``H < h_star``, each such token with probability ``noise_share``)
    The off-mode token was sampled: ``p`` log-uniform on ``[1e-5, 1e-2]`` and
    ``delta ~ Normal(0, noise_sigma)``, so ``E[delta^2 | noise] = noise_sigma^2``.
    Over all valid tokens the planted conditional moment is therefore (see
    :func:`planted_delta2`)

        E[delta^2 | H] = k H^alpha                                      if H >= h_star
        E[delta^2 | H] = (1 - noise_share) k H^alpha + noise_share noise_sigma^2   if H < h_star

    ``h_star = None`` plants no noise regime (no ``is_noise`` token at all).

Logprobs stay <= 0
    ``infer_logprob = -s <= 0`` and ``train_logprob = infer_logprob + delta``. When that sum
    would be positive (``delta > s``) the sign of delta is flipped. ``|delta|`` is unchanged,
    so every second moment above is still exact, and ``train_logprob <= infer_logprob <= 0``
    on flipped tokens (float rounding cannot make it positive: ``fl(-s + d) <= 0`` for
    ``d <= s``). The flip BIASES THE MEAN: for ``delta ~ N(0, sigma)`` given ``s``,
    ``E[delta | s] = -2 sigma phi(s / sigma)`` (phi the standard normal density). It matters
    only where ``s`` is comparable to ``sigma``, i.e. for law tokens at very low entropy
    (``H = 1e-4``: ``sigma ~ 1.4e-3`` vs ``s ~ 1e-4``, so delta is then mostly negative, as
    in real logs where log pi cannot exceed 0). Statistics of the sign of delta (k1 KL,
    Geo-RS, sequence ratios) see this bias; statistics of ``delta^2`` do not.

Loss mask and placeholders
    A share ``min(1, masked_share / 0.2)`` of the sequences carries one span with
    ``loss_mask = False`` (a tool response): start ``U{0..L-1}``, length
    ``ceil(f L)`` with ``f ~ U(0, 0.4)``, cut at the sequence end; about ``masked_share`` of
    all tokens. Masked rows carry placeholders as real dumps do: ``infer_logprob`` is 0.0 or
    -9999.0 (one choice per sequence), ``policy_version = -1``; train_logprob and entropy are
    ordinary values. Masked rows are never noise tokens.

Dirty rows (``dirty=True``)
    A share ``dirty_share`` of the LOSS-MASKED (``loss_mask = True``) rows is made invalid,
    one defect per row, kinds in equal proportion (:data:`DIRTY_KINDS`):
    ``nan`` (NaN logprob), ``null`` (missing logprob), ``plus_one`` (+1.0 sentinel),
    ``floor`` (-9999.0), ``neg_inf`` (-inf) -- each on train_logprob or infer_logprob, side
    drawn at random; ``zero`` (exact 0.0 padding of one side while the other side is made
    clearly negative: ``min(value, -2.0)``); ``neg_entropy`` (entropy ``-H``);
    ``neg_version`` (``policy_version = -1``). Dirty rows have ``is_noise = False``; their
    counts per kind are in the summary, so a loader's exclusion accounting can be checked.

Determinism
    Data are generated in fixed blocks of whole sequences (``_block_seqs(spec)``), block
    ``b`` from ``numpy.random.SeedSequence([seed, b])``. Chunks re-slice that stream at
    sequence boundaries, so the data do not depend on ``chunk_tokens`` (nor on the layout).

Layouts
    ``long``: one row per token, columns :data:`LONG_COLUMNS`.
    ``nested``: one row per sequence (verl-like): scalars ``seq_id, step, train_version,
    advantage``; list columns ``train_logprob, infer_logprob, entropy, policy_version,
    loss_mask, token_id, is_noise`` of equal length. No ``position`` column: the position is
    the list index (METHOD.md: "absent: row order").
"""

from __future__ import annotations

import dataclasses
import math
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from entr_diag.errors import ParameterError

__all__ = [
    "DIRTY_KINDS",
    "DIRTY_KIND_REASON",
    "LONG_COLUMNS",
    "NESTED_LIST_COLUMNS",
    "NESTED_SCALAR_COLUMNS",
    "SynthSpec",
    "generate",
    "iter_chunks",
    "planted_delta2",
    "summarize",
    "write_synth",
]

#: Kinds of invalid loss-masked rows planted when ``SynthSpec.dirty`` is true.
DIRTY_KINDS: tuple[str, ...] = (
    "nan",
    "null",
    "plus_one",
    "floor",
    "neg_inf",
    "zero",
    "neg_entropy",
    "neg_version",
)
_LOGPROB_KINDS = {"nan", "null", "plus_one", "floor", "neg_inf", "zero"}

#: The exclusion reason of :data:`entr_diag.io.schema.EXCLUSION_REASONS` each dirty kind
#: falls under (one defect per row, so the loader's per-reason counts are sums of these).
DIRTY_KIND_REASON: dict[str, str] = {
    "nan": "non_finite_logprob",
    "null": "non_finite_logprob",
    "neg_inf": "non_finite_logprob",
    "floor": "sentinel_logprob",
    "plus_one": "positive_logprob",
    "zero": "zero_placeholder",
    "neg_entropy": "invalid_entropy",
    "neg_version": "negative_version",
}

#: Columns of the long layout, in order.
LONG_COLUMNS: tuple[str, ...] = (
    "seq_id",
    "position",
    "step",
    "train_logprob",
    "infer_logprob",
    "entropy",
    "policy_version",
    "train_version",
    "loss_mask",
    "token_id",
    "advantage",
    "is_noise",
)
NESTED_SCALAR_COLUMNS: tuple[str, ...] = ("seq_id", "step", "train_version", "advantage")
NESTED_LIST_COLUMNS: tuple[str, ...] = (
    "train_logprob",
    "infer_logprob",
    "entropy",
    "policy_version",
    "loss_mask",
    "token_id",
    "is_noise",
)

_ARROW_TYPES: dict[str, pa.DataType] = {
    "seq_id": pa.int64(),
    "position": pa.int64(),
    "step": pa.int64(),
    "train_logprob": pa.float64(),
    "infer_logprob": pa.float64(),
    "entropy": pa.float64(),
    "policy_version": pa.int64(),
    "train_version": pa.int64(),
    "loss_mask": pa.bool_(),
    "token_id": pa.int64(),
    "advantage": pa.float64(),
    "is_noise": pa.bool_(),
}

_VOCAB = 151_936  # token ids are log-uniform (Zipf-like) in [0, _VOCAB)
_NOISE_P_LO, _NOISE_P_HI = 1e-5, 1e-2
_MASK_SPAN_MEAN_FRAC = 0.2  # mean of f ~ U(0, 0.4)
_BLOCK_TOKENS = 1 << 17  # target tokens per generation block (fixed: part of the data's definition)


@dataclass(frozen=True)
class SynthSpec:
    """Parameters of a synthetic rollout log; the planted model is in the module docstring.

    Entropies and log-probabilities are in nats. Raises :class:`ParameterError` on invalid
    values.
    """

    n_tokens: int = 200_000
    seed: int = 0
    k: float = 0.02
    alpha: float = 1.0
    h_star: float | None = 0.03
    noise_share: float = 0.3
    noise_sigma: float = 0.5
    mean_seq_len: int = 200
    n_steps: int = 10
    max_staleness: int = 3
    switch_share: float = 0.2
    h_min: float = 1e-4
    h_max: float = 4.0
    staleness_gain: float = 0.0
    masked_share: float = 0.03
    dirty: bool = False
    dirty_share: float = 0.01

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise ParameterError(f"SynthSpec: {msg}")

        if int(self.n_tokens) != self.n_tokens or self.n_tokens < 1:
            bad(f"n_tokens must be a positive integer, got {self.n_tokens!r}.")
        if int(self.seed) != self.seed or self.seed < 0:
            bad(f"seed must be a non-negative integer, got {self.seed!r}.")
        if not (self.k > 0 and math.isfinite(self.k)):
            bad(f"k must be positive and finite, got {self.k!r}.")
        if not (0 < self.alpha <= 4):
            bad(f"alpha must be in (0, 4] (measured laws have alpha near 1), got {self.alpha!r}.")
        if not (0 < self.h_min < self.h_max and math.isfinite(self.h_max)):
            bad(f"need 0 < h_min < h_max < inf, got h_min={self.h_min!r}, h_max={self.h_max!r}.")
        if self.h_star is not None and not (self.h_star > 0 and math.isfinite(self.h_star)):
            bad(f"h_star must be a positive number of nats, or None for no noise regime, "
                f"got {self.h_star!r}.")
        if self.h_star is not None and self.h_star >= self.h_max:
            bad(f"h_star must be below h_max = {self.h_max!r} nats (else no token follows the "
                f"law), got {self.h_star!r}.")
        for name in ("noise_share", "switch_share", "masked_share", "dirty_share"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                bad(f"{name} must be in [0, 1], got {v!r}.")
        if not (self.noise_sigma >= 0 and math.isfinite(self.noise_sigma)):
            bad(f"noise_sigma must be >= 0, got {self.noise_sigma!r}.")
        if int(self.mean_seq_len) != self.mean_seq_len or self.mean_seq_len < 1:
            bad(f"mean_seq_len must be an integer >= 1, got {self.mean_seq_len!r}.")
        if int(self.n_steps) != self.n_steps or self.n_steps < 1:
            bad(f"n_steps must be an integer >= 1, got {self.n_steps!r}.")
        if int(self.max_staleness) != self.max_staleness or self.max_staleness < 0:
            bad(f"max_staleness must be an integer >= 0, got {self.max_staleness!r}.")
        if not (self.staleness_gain >= 0 and math.isfinite(self.staleness_gain)):
            bad(f"staleness_gain must be >= 0, got {self.staleness_gain!r}.")
        # the law's log-ratio scale at the top of the entropy range (the stalest tokens)
        top = (1 + self.staleness_gain * self.max_staleness) * self.h_max ** self.alpha
        if math.sqrt(self.k * top) > MAX_DELTA_SD:
            bad(f"k = {self.k:g} plants log-ratios of standard deviation "
                f"{math.sqrt(self.k * top):.3g} nats at h_max = {self.h_max:g} nats, far beyond "
                f"any engine/trainer mismatch (whose tails then pass the -1000-nat floor the "
                f"reader takes for placeholders); give k <= {MAX_DELTA_SD ** 2 / top:.3g}.")
        if self.noise_sigma > MAX_DELTA_SD:
            bad(f"noise_sigma must be at most {MAX_DELTA_SD:g} nats, got {self.noise_sigma!r}.")

    def to_dict(self) -> dict:
        """Plain-Python dict of every parameter (JSON-ready)."""
        return dataclasses.asdict(self)


#: the largest standard deviation of a planted log-ratio (nats): the law's at h_max, and the
#: noise's; a real engine/trainer mismatch stays within a few nats
MAX_DELTA_SD = 10.0


def planted_delta2(h, spec: SynthSpec, staleness=0):
    """The planted ``E[delta^2 | H]`` (nats^2) over valid loss-masked tokens, elementwise.

    ``k (1 + staleness_gain * staleness) H^alpha`` above ``h_star``; below it the mixture
    ``(1 - noise_share) * law + noise_share * noise_sigma^2`` (module docstring).
    Accepts scalars or numpy arrays for ``h`` and ``staleness``.
    """
    h = np.asarray(h, dtype=np.float64)
    law = (
        spec.k
        * (1.0 + spec.staleness_gain * np.asarray(staleness, dtype=np.float64))
        * h**spec.alpha
    )
    if spec.h_star is None:
        return law
    mix = (1.0 - spec.noise_share) * law + spec.noise_share * spec.noise_sigma**2
    return np.where(h < spec.h_star, mix, law)


# --------------------------------------------------------------------------- generation


def _block_seqs(spec: SynthSpec) -> int:
    return max(1, _BLOCK_TOKENS // spec.mean_seq_len)


class _Chunk:
    """Numpy columns of whole sequences: ``cols`` per token, ``seq`` per sequence, ``offsets``."""

    __slots__ = ("cols", "nulls", "seq", "offsets", "dirty_kind")

    def __init__(self, cols, nulls, seq, offsets, dirty_kind):
        self.cols: dict[str, np.ndarray] = cols  # token-level arrays
        self.nulls: dict[str, np.ndarray] = nulls  # token-level null masks (True = null)
        self.seq: dict[str, np.ndarray] = seq  # sequence-level arrays (seq_id, step, ...)
        self.offsets: np.ndarray = offsets  # int64, len n_seq + 1, starting at 0
        self.dirty_kind: np.ndarray = dirty_kind  # int8 per token: -1 clean, else DIRTY_KINDS index

    @property
    def n_tokens(self) -> int:
        return int(self.offsets[-1])

    @property
    def n_seqs(self) -> int:
        return len(self.offsets) - 1

    def slice_seqs(self, a: int, b: int) -> _Chunk:
        t0, t1 = int(self.offsets[a]), int(self.offsets[b])
        return _Chunk(
            {k: v[t0:t1] for k, v in self.cols.items()},
            {k: v[t0:t1] for k, v in self.nulls.items()},
            {k: v[a:b] for k, v in self.seq.items()},
            self.offsets[a : b + 1] - t0,
            self.dirty_kind[t0:t1],
        )

    @staticmethod
    def concat(parts: list[_Chunk]) -> _Chunk:
        if len(parts) == 1:
            return parts[0]
        offs = [parts[0].offsets]
        base = parts[0].n_tokens
        for p in parts[1:]:
            offs.append(p.offsets[1:] + base)
            base += p.n_tokens
        return _Chunk(
            {k: np.concatenate([p.cols[k] for p in parts]) for k in parts[0].cols},
            {k: np.concatenate([p.nulls[k] for p in parts]) for k in parts[0].nulls},
            {k: np.concatenate([p.seq[k] for p in parts]) for k in parts[0].seq},
            np.concatenate(offs),
            np.concatenate([p.dirty_kind for p in parts]),
        )


def _gen_block(spec: SynthSpec, b: int, seq0: int, tok0: int) -> _Chunk:
    """Block ``b``: sequences from global index ``seq0``, first token at global offset ``tok0``."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([spec.seed, b])))
    ns = _block_seqs(spec)

    # ---- sequence level (always the same number of draws per block)
    lengths = rng.geometric(1.0 / spec.mean_seq_len, size=ns).astype(np.int64)
    u_lag = rng.random(ns)
    u_switch = rng.random(ns)
    u_switch_pos = rng.random(ns)
    u_span = rng.random(ns)
    u_span_start = rng.random(ns)
    u_span_frac = rng.random(ns)
    u_placeholder = rng.random(ns)
    advantage = rng.standard_normal(ns)

    remaining = spec.n_tokens - tok0
    ends = np.cumsum(lengths)
    if ends[-1] >= remaining:  # last block: truncate to exactly n_tokens
        n_keep = int(np.searchsorted(ends, remaining, side="left")) + 1
        lengths = lengths[:n_keep].copy()
        lengths[-1] -= int(ends[n_keep - 1] - remaining)
        sl = slice(0, n_keep)
        u_lag, u_switch, u_switch_pos = u_lag[sl], u_switch[sl], u_switch_pos[sl]
        u_span, u_span_start, u_span_frac = u_span[sl], u_span_start[sl], u_span_frac[sl]
        u_placeholder, advantage = u_placeholder[sl], advantage[sl]
        ns = n_keep
    offsets = np.zeros(ns + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    nt = int(offsets[-1])
    starts_global = tok0 + offsets[:-1]

    step = (starts_global * spec.n_steps) // spec.n_tokens
    np.minimum(step, spec.n_steps - 1, out=step)
    train_version = step
    ms = spec.max_staleness
    can_switch = (step >= 1) & (ms >= 1) & (lengths >= 2)
    switched = (u_switch < spec.switch_share) & can_switch
    lag = np.floor(u_lag * (ms + 1)).astype(np.int64)  # U{0..ms}
    lag_sw = 1 + np.floor(u_lag * max(ms, 1)).astype(np.int64)  # U{1..ms}
    lag = np.where(switched, lag_sw, lag)
    v0 = np.maximum(0, step - lag)
    switch_pos = np.where(
        switched, 1 + np.floor(u_switch_pos * (lengths - 1)).astype(np.int64), lengths
    )

    p_span = min(1.0, spec.masked_share / _MASK_SPAN_MEAN_FRAC)
    has_span = u_span < p_span
    span_start = np.floor(u_span_start * lengths).astype(np.int64)
    span_len = np.where(has_span, np.ceil(0.4 * u_span_frac * lengths).astype(np.int64), 0)
    span_end = np.minimum(span_start + span_len, lengths)
    placeholder = np.where(u_placeholder < 0.5, 0.0, -9999.0)

    # ---- token level
    seq_of_tok = np.repeat(np.arange(ns), lengths)
    position = np.arange(nt, dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    policy_version = v0[seq_of_tok] + (position >= switch_pos[seq_of_tok])
    staleness = train_version[seq_of_tok] - policy_version
    loss_mask = ~((position >= span_start[seq_of_tok]) & (position < span_end[seq_of_tok]))

    log_hmin, log_hmax = math.log(spec.h_min), math.log(spec.h_max)
    entropy = np.exp(log_hmin + (log_hmax - log_hmin) * rng.random(nt))
    surprisal = entropy * rng.standard_exponential(nt)
    z = rng.standard_normal(nt)
    kk = spec.k if spec.staleness_gain == 0 else spec.k * (1.0 + spec.staleness_gain * staleness)
    sigma = np.sqrt(kk * entropy**spec.alpha)
    token_id = (np.exp(rng.random(nt) * math.log(_VOCAB))).astype(np.int64) - 1
    np.clip(token_id, 0, _VOCAB - 1, out=token_id)

    if spec.h_star is not None and spec.noise_share > 0:
        u_noise = rng.random(nt)
        is_noise = (entropy < spec.h_star) & (u_noise < spec.noise_share) & loss_mask
        n_noise = int(is_noise.sum())
        lp, hp = math.log(_NOISE_P_LO), math.log(_NOISE_P_HI)
        surprisal[is_noise] = -(lp + (hp - lp) * rng.random(n_noise))
        sigma[is_noise] = spec.noise_sigma
    else:
        is_noise = np.zeros(nt, dtype=bool)

    delta = sigma * z
    flip = delta > surprisal
    delta[flip] = -delta[flip]
    infer = -surprisal
    train = infer + delta

    # masked rows: engine placeholders
    masked = ~loss_mask
    infer[masked] = placeholder[seq_of_tok[masked]]
    policy_version[masked] = -1

    nulls = {"train_logprob": np.zeros(nt, dtype=bool), "infer_logprob": np.zeros(nt, dtype=bool)}
    dirty_kind = np.full(nt, -1, dtype=np.int8)
    if spec.dirty and spec.dirty_share > 0:
        u_dirty = rng.random(nt)
        side_train = rng.random(nt) < 0.5
        is_dirty = (u_dirty < spec.dirty_share) & loss_mask
        kind = np.floor(u_dirty / spec.dirty_share * len(DIRTY_KINDS)).astype(np.int8)
        np.minimum(kind, len(DIRTY_KINDS) - 1, out=kind)
        dirty_kind = np.where(is_dirty, kind, -1).astype(np.int8)
        is_noise = is_noise & ~is_dirty
        for ki, name in enumerate(DIRTY_KINDS):
            rows = dirty_kind == ki
            if not rows.any():
                continue
            if name in _LOGPROB_KINDS:
                on_train = rows & side_train
                on_infer = rows & ~side_train
                if name == "zero":
                    train[on_infer] = np.minimum(train[on_infer], -2.0)
                    infer[on_train] = np.minimum(infer[on_train], -2.0)
                value = {
                    "nan": np.nan,
                    "null": np.nan,
                    "plus_one": 1.0,
                    "floor": -9999.0,
                    "neg_inf": -np.inf,
                    "zero": 0.0,
                }[name]
                train[on_train] = value
                infer[on_infer] = value
                if name == "null":
                    nulls["train_logprob"] |= on_train
                    nulls["infer_logprob"] |= on_infer
            elif name == "neg_entropy":
                entropy[rows] = -entropy[rows]
            elif name == "neg_version":
                policy_version[rows] = -1

    cols = {
        "position": position,
        "train_logprob": train,
        "infer_logprob": infer,
        "entropy": entropy,
        "policy_version": policy_version,
        "loss_mask": loss_mask,
        "token_id": token_id,
        "is_noise": is_noise,
    }
    seq = {
        "seq_id": np.arange(seq0, seq0 + ns, dtype=np.int64),
        "step": step,
        "train_version": train_version,
        "advantage": advantage,
        "switched": switched,
    }
    return _Chunk(cols, nulls, seq, offsets, dirty_kind)


def _iter_raw(spec: SynthSpec, chunk_tokens: int) -> Iterator[_Chunk]:
    """Chunks of whole sequences of about ``chunk_tokens`` tokens (a longer single sequence
    makes a larger chunk); the concatenation does not depend on ``chunk_tokens``."""
    if int(chunk_tokens) != chunk_tokens or chunk_tokens < 1:
        raise ParameterError(f"chunk_tokens must be a positive integer, got {chunk_tokens!r}.")
    pending: list[_Chunk] = []
    n_pending = 0
    tok0 = seq0 = 0
    b = 0
    while tok0 < spec.n_tokens:
        blk = _gen_block(spec, b, seq0, tok0)
        b += 1
        tok0 += blk.n_tokens
        seq0 += blk.n_seqs
        pending.append(blk)
        n_pending += blk.n_tokens
        last = tok0 >= spec.n_tokens
        if n_pending < chunk_tokens and not last:
            continue
        buf = _Chunk.concat(pending)
        pending, n_pending = [], 0
        a = 0
        while a < buf.n_seqs:
            remaining = int(buf.offsets[-1]) - int(buf.offsets[a])
            if remaining < chunk_tokens and not last:
                break
            # the longest run of whole sequences with <= chunk_tokens tokens (at least one)
            cut = (
                int(np.searchsorted(buf.offsets, int(buf.offsets[a]) + chunk_tokens, side="right"))
                - 1
            )
            cut = min(max(cut, a + 1), buf.n_seqs)
            yield buf.slice_seqs(a, cut)
            a = cut
        if a < buf.n_seqs:
            rest = buf.slice_seqs(a, buf.n_seqs)
            pending, n_pending = [rest], rest.n_tokens


def _long_table(c: _Chunk) -> pa.Table:
    lengths = np.diff(c.offsets)
    arrays = {}
    for name in LONG_COLUMNS:
        if name in c.seq:
            arr = np.repeat(c.seq[name], lengths)
        else:
            arr = c.cols[name]
        mask = c.nulls.get(name)
        if mask is not None and mask.any():
            arrays[name] = pa.array(arr, type=_ARROW_TYPES[name], mask=mask)
        else:
            arrays[name] = pa.array(arr, type=_ARROW_TYPES[name])
    return pa.table(arrays)


def _nested_table(c: _Chunk) -> pa.Table:
    if c.n_tokens >= 2**31:
        raise ParameterError("chunk_tokens must be below 2**31 for the nested layout.")
    offsets = pa.array(c.offsets.astype(np.int32))
    arrays = {}
    for name in NESTED_SCALAR_COLUMNS:
        arrays[name] = pa.array(c.seq[name], type=_ARROW_TYPES[name])
    for name in NESTED_LIST_COLUMNS:
        mask = c.nulls.get(name)
        if mask is not None and mask.any():
            values = pa.array(c.cols[name], type=_ARROW_TYPES[name], mask=mask)
        else:
            values = pa.array(c.cols[name], type=_ARROW_TYPES[name])
        arrays[name] = pa.ListArray.from_arrays(offsets, values)
    return pa.table(arrays)


def iter_chunks(spec: SynthSpec, chunk_tokens: int = 1_000_000) -> Iterator[pl.DataFrame]:
    """Yield the synthetic log as long-layout DataFrames of whole sequences.

    Each frame has about ``chunk_tokens`` rows (one per token, columns :data:`LONG_COLUMNS`),
    never splitting a sequence. Concatenating the frames gives the same data whatever
    ``chunk_tokens`` is. Raises :class:`ParameterError` for ``chunk_tokens < 1``.
    """
    for c in _iter_raw(spec, chunk_tokens):
        yield pl.from_arrow(_long_table(c))


def generate(spec: SynthSpec) -> pl.DataFrame:
    """The whole synthetic log in memory (long layout, one row per token): for small ``n_tokens``."""
    frames = list(iter_chunks(spec, chunk_tokens=max(spec.n_tokens, 1)))
    return frames[0] if len(frames) == 1 else pl.concat(frames)


# --------------------------------------------------------------------------- summary


class _Counter:
    def __init__(self, spec: SynthSpec):
        self.spec = spec
        self.tokens = self.sequences = self.masked = self.noise = 0
        self.below_h_star = self.switched = self.switched_visible = 0
        self.dirty = dict.fromkeys(DIRTY_KINDS, 0)
        self.steps = np.zeros(spec.n_steps, dtype=np.int64)

    def add(self, c: _Chunk) -> None:
        self.tokens += c.n_tokens
        self.sequences += c.n_seqs
        lm = c.cols["loss_mask"]
        self.masked += int((~lm).sum())
        self.noise += int(c.cols["is_noise"].sum())
        self.switched += int(c.seq["switched"].sum())
        # a planted switch is visible only if valid tokens lie on both sides of it
        valid = lm & (c.dirty_kind < 0)
        pv = c.cols["policy_version"]
        v0 = np.repeat(c.seq["train_version"], np.diff(c.offsets))  # upper bound
        lo = np.minimum.reduceat(np.where(valid, pv, v0 + 1), c.offsets[:-1])
        hi = np.maximum.reduceat(np.where(valid, pv, -1), c.offsets[:-1])
        self.switched_visible += int((c.seq["switched"] & (hi > lo) & (hi >= 0)).sum())
        counts = np.bincount(c.dirty_kind[c.dirty_kind >= 0], minlength=len(DIRTY_KINDS))
        for i, name in enumerate(DIRTY_KINDS):
            self.dirty[name] += int(counts[i])
        if self.spec.h_star is not None:
            self.below_h_star += int((valid & (c.cols["entropy"] < self.spec.h_star)).sum())
        self.steps += np.bincount(
            np.repeat(c.seq["step"], np.diff(c.offsets)), minlength=self.spec.n_steps
        )

    def result(self) -> dict:
        dirty_total = sum(self.dirty.values())
        valid = self.tokens - self.masked - dirty_total
        return {
            "generator": "entr_diag.synth",
            "spec": self.spec.to_dict(),
            "tokens": self.tokens,
            "sequences": self.sequences,
            "masked_tokens": self.masked,
            "loss_mask_tokens": self.tokens - self.masked,
            "dirty_tokens": dirty_total,
            "dirty": dict(self.dirty),
            "valid_tokens": valid,
            "noise_tokens": self.noise,
            "law_tokens": valid - self.noise,
            "valid_tokens_below_h_star": self.below_h_star
            if self.spec.h_star is not None
            else None,
            "switched_sequences": self.switched,
            "switched_sequences_visible": self.switched_visible,
            "tokens_per_step": [int(x) for x in self.steps],
            "planted_law": {
                "formula": "E[delta^2|H] = k*(1+staleness_gain*staleness)*H**alpha for law tokens",
                "k": self.spec.k,
                "alpha": self.spec.alpha,
                "staleness_gain": self.spec.staleness_gain,
                "h_star": self.spec.h_star,
                "noise_delta2": self.spec.noise_sigma**2 if self.spec.h_star is not None else None,
            },
        }


def summarize(spec: SynthSpec, chunk_tokens: int = 1_000_000) -> dict:
    """The ground-truth summary :func:`write_synth` returns, without writing a file."""
    counter = _Counter(spec)
    for c in _iter_raw(spec, chunk_tokens):
        counter.add(c)
    return counter.result()


#: key of the Parquet schema metadata marking a file written by :func:`write_synth` (its value:
#: the spec and layout as JSON); ``entr-diag synth`` overwrites only such files
SYNTH_METADATA_KEY: bytes = b"entr_diag.synth"


def _spec_json(spec: SynthSpec, layout: str) -> bytes:
    import json

    return json.dumps({"layout": layout, **dataclasses.asdict(spec)}, default=str).encode()


def is_synth_output(path) -> bool:
    """Whether ``path`` is a Parquet file written by :func:`write_synth` (its schema metadata
    holds :data:`SYNTH_METADATA_KEY`); False for any other file, or one that cannot be
    read as Parquet."""
    try:
        md = pq.read_schema(path).metadata or {}
    except (OSError, ValueError, pa.ArrowException):
        return False
    return SYNTH_METADATA_KEY in md


def write_synth(
    path,
    spec: SynthSpec,
    *,
    layout: str = "long",
    chunk_tokens: int = 1_000_000,
    row_group_size: int = 256_000,
) -> dict:
    """Write the synthetic log to one zstd Parquet file in bounded memory; return its ground truth.

    ``layout``: ``"long"`` (one row per token) or ``"nested"`` (one row per sequence, list
    columns; see module docstring). Memory is bounded by ``chunk_tokens`` (whole sequences are
    generated and written chunk by chunk). ``row_group_size`` counts rows for ``long`` and
    tokens for ``nested`` (rows per group = ``max(1, row_group_size // mean_seq_len)``).
    The file is written to a temporary name in the same directory and moved into place with
    :func:`os.replace`, so ``path`` never holds a partial file.

    Returns a dict of plain Python values: ``spec``, ``path``, ``layout``, ``rows``, ``bytes``
    and the realised counts (``tokens``, ``sequences``, ``masked_tokens``, ``dirty`` per kind,
    ``valid_tokens``, ``noise_tokens``, ``law_tokens``, ``switched_sequences``,
    ``switched_sequences_visible``, ``tokens_per_step``, ``planted_law``).
    Raises :class:`ParameterError` for an unknown layout or bad sizes.
    """
    if layout not in ("long", "nested"):
        raise ParameterError(f"layout must be 'long' or 'nested', got {layout!r}.")
    if int(row_group_size) != row_group_size or row_group_size < 1:
        raise ParameterError(f"row_group_size must be a positive integer, got {row_group_size!r}.")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    counter = _Counter(spec)
    rows = 0
    rg = row_group_size if layout == "long" else max(1, row_group_size // spec.mean_seq_len)
    writer = None
    try:
        for c in _iter_raw(spec, chunk_tokens):
            counter.add(c)
            table = _long_table(c) if layout == "long" else _nested_table(c)
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema.with_metadata(
                    {SYNTH_METADATA_KEY: _spec_json(spec, layout)}), compression="zstd")
            writer.write_table(table, row_group_size=rg)
            rows += table.num_rows
            del table
        writer.close()
        writer = None
        os.replace(tmp, path)
    finally:
        if writer is not None:
            writer.close()
        if tmp.exists():
            tmp.unlink()
    out = counter.result()
    out.update({"path": str(path), "layout": layout, "rows": rows, "bytes": path.stat().st_size})
    return out
