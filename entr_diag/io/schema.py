"""Canonical per-token columns and the names frameworks use for them.

The canonical columns are those of ``shared/METHOD.md`` ("Canonical columns"). Every loader
maps a dump's own column names onto them; this module is the single table of which source
names are recognised, which are refused as ambiguous, and how each framework spells them.

Sources for the aliases: the rollout/trainer data structures of verl (``old_log_probs``,
``rollout_log_probs``, ``entropys`` (computed in the actor's forward pass, so it is the
trainer-side entropy), ``response_mask``), slime (``log_probs`` is the
trainer recomputation, ``rollout_log_probs``, ``loss_masks``; ``rollout_id`` is the index of
the rollout, i.e. the training step (``for rollout_id in range(args.start_rollout_id,
args.num_rollout)`` in its ``train.py``), and a sample's id is ``Sample.index``, written
``sample_indices`` in its training data), AReaL (``prox_logp``, bare
``logprobs`` from the engine, per-token ``versions``), OpenRLHF (``action_log_probs``,
``rollout_log_probs``, ``action_mask``), TRL (``old_per_token_logps``,
``sampling_per_token_logps``, ``completion_mask``), NeMo-RL (``prev_logprobs``,
``generation_logprobs``, ``token_mask``), ROLL (``infer_logprobs``) and SkyRL
(``action_log_probs``, ``rollout_logprobs``, ``loss_mask``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

#: kinds of value a column may hold: "float", "int", "bool", "id" (int or string)
FLOAT, INT, BOOL, ID = "float", "int", "bool", "id"
#: each kind in words, for error messages
KIND_WORDS = {FLOAT: "numeric", INT: "integer", BOOL: "boolean or 0/1 numeric",
              ID: "integer or string"}


@dataclass(frozen=True)
class Column:
    """One canonical column: its name, value kind, unit/meaning and whether it is required."""

    name: str
    kind: str
    meaning: str
    required: bool = False
    #: source names auto-detected (in priority order) when the canonical name is absent
    aliases: tuple[str, ...] = ()
    #: per-sequence scalar in the nested layout (broadcast to each token)
    per_sequence: bool = False


COLUMNS: tuple[Column, ...] = (
    Column("seq_id", ID, "trajectory (sample) id; resampling is by sequence", False,
           ("sequence_id", "sample_id", "sample_idx", "sample_indices", "traj_id", "trajectory_id",
            "rollout_id"),
           per_sequence=True),
    Column("position", INT, "0-based index of the token in the response (absent: row order)",
           False, ("pos", "token_position", "token_idx", "token_index")),
    Column("step", INT, "trainer step the token was trained in", False,
           ("global_step", "global_steps", "train_step", "training_step", "iteration"),
           per_sequence=True),
    Column("train_logprob", FLOAT, "log pi_theta(y_t) of the sampled token, trainer side, nats <= 0",
           True, ("old_log_probs", "old_log_prob", "old_logprobs", "prox_logp", "prev_logprobs",
                  "old_per_token_logps", "action_log_probs", "train_logprobs", "trainer_logprobs")),
    Column("train_logprob_recompute", FLOAT,
           "second trainer recomputation of the same policy (trainer self-noise floor), nats", False),
    Column("infer_logprob", FLOAT, "log mu(y_t) of the sampled token, inference engine, nats <= 0",
           True, ("rollout_log_probs", "rollout_logprobs", "response_logprobs",
                  "sampling_per_token_logps", "generation_logprobs", "infer_logprobs",
                  "inference_logprobs", "rollout_logprob")),
    Column("entropy", FLOAT, "inference-side entropy of the sampling distribution, nats >= 0",
           False, ("entropies", "token_entropy", "infer_entropy", "rollout_entropy",
                   "rollout_entropys", "inference_entropy")),
    Column("train_entropy", FLOAT, "trainer-side entropy, nats >= 0", False,
           # verl's ``entropys`` comes from the actor's (trainer's) forward pass
           ("entropys", "trainer_entropy", "train_entropys")),
    Column("policy_version", INT, "weights version that sampled the token", False,
           ("versions", "weight_version", "behavior_version", "rollout_version",
            "policy_versions")),
    Column("train_version", INT, "weights version of train_logprob", False,
           ("trainer_version", "current_version")),
    Column("loss_mask", BOOL, "true where the token is trained on (absent: all true)", False,
           ("response_mask", "loss_masks", "action_mask", "completion_mask", "token_mask")),
    Column("token_id", INT, "sampled token id", False,
           ("token_ids", "response_ids", "output_ids", "responses")),
    Column("advantage", FLOAT, "per-token or per-sequence advantage", False,
           ("advantages",), per_sequence=False),
    Column("cu_seqlens", INT, "nested layout, packed rows: cumulative sequence lengths "
           "[0, n1, n1 + n2, ..., row length] of the sequences a row packs one after another "
           "(FlashAttention varlen / AReaL micro-batches)", False,
           ("cu_seq_lens", "cu_seqlens_q"), per_sequence=True),
)
#: canonical columns that describe a row, never a token: not read per token
ROW_COLUMNS: tuple[str, ...] = ("cu_seqlens",)

BY_NAME: dict[str, Column] = {c.name: c for c in COLUMNS}
CANONICAL: tuple[str, ...] = tuple(c.name for c in COLUMNS)
REQUIRED: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.required)

#: Names that mean different things in different frameworks; never mapped automatically.
AMBIGUOUS: dict[str, str] = {
    "logprobs": "the engine's logprob in AReaL and prime-rl (infer_logprob), the trainer's elsewhere",
    "log_probs": "the trainer's recomputation in slime (train_logprob), the current policy in verl",
    "log_prob": "the current policy's logprob in several trainers, not the behaviour policy",
}

#: ``--framework NAME``: that framework's own spelling, tried before the generic aliases.
#: Only here may an ambiguous name be taken, because the framework fixes its meaning.
FRAMEWORKS: dict[str, dict[str, str]] = {
    "verl": {"train_logprob": "old_log_probs", "infer_logprob": "rollout_log_probs",
             "train_entropy": "entropys", "loss_mask": "response_mask", "token_id": "responses",
             "advantage": "advantages"},
    "slime": {"seq_id": "index", "step": "rollout_id", "train_logprob": "log_probs",
              "infer_logprob": "rollout_log_probs", "loss_mask": "loss_masks",
              "advantage": "advantages"},
    "areal": {"train_logprob": "prox_logp", "infer_logprob": "logprobs",
              "policy_version": "versions", "loss_mask": "loss_mask",
              "advantage": "advantages"},
    "openrlhf": {"train_logprob": "action_log_probs", "infer_logprob": "rollout_log_probs",
                 "loss_mask": "action_mask", "advantage": "advantages"},
    "trl": {"train_logprob": "old_per_token_logps", "infer_logprob": "sampling_per_token_logps",
            "loss_mask": "completion_mask", "token_id": "completion_ids",
            "advantage": "advantages"},
    "nemo-rl": {"train_logprob": "prev_logprobs", "infer_logprob": "generation_logprobs",
                "loss_mask": "token_mask", "advantage": "advantages"},
    "roll": {"train_logprob": "old_log_probs", "infer_logprob": "infer_logprobs",
             "loss_mask": "response_mask", "advantage": "advantages"},
    "skyrl": {"train_logprob": "action_log_probs", "infer_logprob": "rollout_logprobs",
              "loss_mask": "loss_mask", "advantage": "advantages"},
    "prime-rl": {"infer_logprob": "logprobs", "loss_mask": "loss_mask"},
}

#: Names every framework spells alike with one meaning: never "another framework's name".
SHARED_NAMES: frozenset[str] = frozenset({"advantages"})


def users_of(name: str, canon: str) -> tuple[str, ...]:
    """The frameworks whose preset reads canonical column ``canon`` from source ``name``."""
    return tuple(k for k, preset in FRAMEWORKS.items() if preset.get(canon) == name)


def other_uses(name: str, canon: str) -> tuple[tuple[str, str], ...]:
    """(framework, canonical column) for each preset that reads source ``name`` as a column
    other than ``canon`` (slime reads ``rollout_id``, elsewhere a sequence id, as the step)."""
    return tuple((k, c) for k, preset in FRAMEWORKS.items() for c, n in preset.items()
                 if n == name and c != canon)


def foreign_names(framework: str) -> dict[str, tuple[str, ...]]:
    """Source names that other frameworks' presets use and ``framework``'s does not (name ->
    those frameworks). With ``--framework`` they are never auto-detected as the column those
    presets read them as: a preset maps its own names, the canonical names and the generic
    aliases, never another framework's (``rollout_id``, slime's step, stays a generic alias
    of ``seq_id`` for the others)."""
    own = set(FRAMEWORKS[framework].values())
    out: dict[str, list[str]] = {}
    for key, preset in FRAMEWORKS.items():
        for name in preset.values():
            if key != framework and name not in own and name not in CANONICAL \
                    and name not in SHARED_NAMES and key not in out.get(name, []):
                out.setdefault(name, []).append(key)
    return {k: tuple(v) for k, v in out.items()}


#: Exclusion reasons, in the order they are tested (a token counts under the first that fits).
EXCLUSION_REASONS: dict[str, str] = {
    "invalid_loss_mask": "a numeric loss_mask other than 0 or 1 (e.g. 0.5, 2, -1, NaN: a weight "
                         "or label column mapped as the mask?)",
    "null_loss_mask": "loss_mask is null",
    "missing_seq_id": "seq_id is null",
    "invalid_position": "position is null or negative (the token cannot be placed in its "
                        "sequence)",
    "non_finite_logprob": "train or infer logprob is NaN, null or +-inf",
    "sentinel_logprob": "a logprob <= -1000 (padding floors such as -9999 / -99999)",
    "positive_logprob": "a logprob > 1e-4 nats (impossible for a probability; e.g. +1.0 sentinels)",
    "zero_placeholder": "exactly 0.0 on one side while the other side is below -0.05 nats, "
                        "or on both sides at an entropy of 0.001 nats or more",
    "invalid_entropy": "entropy NaN, null, +-inf, below -1e-4 or above 20 nats (H <= ln V)",
    "negative_version": "policy_version or train_version < 0 (prompt-position marker)",
}

#: a logprob at or below this is a padding floor, not a probability (nats)
SENTINEL_FLOOR = -1e3
#: implausible logprobs: a valid token with a logprob at or below this (nats) on either side
#: is a placeholder or corrupt value, not a sampled token. A sampling step picks some token
#: of probability below e^x with probability at most V e^x (a vocabulary of V tokens holds
#: at most V of them), so over N sampled tokens the expected number is at most N V e^x: for
#: N = 1e12 tokens and V = 1e6, e^-50 gives 2e-4 (p < 2e-22), while real tails stay far
#: above (the bundled bf16 run: -16). Above the sentinel floor: such tokens are valid to the
#: loader and enter the fit (the forensics report them; the units and rounding checks leave
#: them out).
IMPLAUSIBLE_LOGPROB = -50.0
#: exact 0.0 on one side counts as a placeholder when the other side is below this (nats)
ZERO_PLACEHOLDER_OTHER_MAX = -0.05
#: both logprobs exactly 0.0 at an entropy of this many nats or more: placeholders on both
#: sides (a trainer's fp32 log-softmax gives exactly 0.0 only when the other tokens hold
#: less than ~6e-8 of the mass, i.e. H below ~2e-6 nats), or a one-token nucleus of
#: truncated sampling applied on both sides: either way delta = 0 measures no mismatch
ZERO_BOTH_H_MIN = 1e-3
#: ... unless the engine's exact 0.0s are one-token nuclei of top-p / top-k sampling (the
#: kept token renormalised to probability 1): the trainer's logprob of such a token is
#: above ln 0.5 (it holds at least top-p of the probability, top-p >= 0.5) but for
#: mismatch noise. The zeros of a sequence none of whose zeros has a trainer logprob below
#: it, and which holds other engine logprobs, are read as valid tokens when there are at
#: least NUCLEUS_MIN_TOKENS of them (a placeholder 0.0, an engine side not computed, leaves
#: trainer logprobs of every size, 10% to 50% below ln 0.5, and zeros every token)
#: a logprob of exactly -1.0 is a padding value (verl pads rollout_log_probs with -1) when a
#: column holds at least MINUS_ONE_MIN_TOKENS of them among its valid tokens and
#: MINUS_ONE_EXCESS times as many as at the most frequent of these values (a column rounded
#: to 1, 0.5 or 0.1 nats holds one of them as often): then excluded as ``sentinel_logprob``
MINUS_ONE_CONTROLS = (-0.5, -0.9, -1.1, -2.0)
MINUS_ONE_MIN_TOKENS = 50
MINUS_ONE_EXCESS = 5.0
NUCLEUS_TRAIN_MIN = -0.6931471805599453
NUCLEUS_MIN_TOKENS = 50
#: ... and none are when this share of the engine zeros (with a trainer logprob below
#: ZERO_PLACEHOLDER_OTHER_MAX) of the sequences that hold other engine logprobs (a sequence
#: all zeros is placeholders anyway) or more have a trainer logprob below ln 0.5: a nucleus token
#: holds top-p of the probability or more, so real nuclei almost never do (none of 13,428 on
#: a top-p 0.9 run), while placeholder zeros at random rows do in 10% to 80% of cases, and
#: the sequences with no such zero by chance would read as nuclei
NUCLEUS_MAX_LOW_SHARE = 0.05
#: a logprob above 0 but at most this (nats) is float rounding of a near-certain token
#: (log-softmax in fp32 gives +1e-7): kept as it is; above it, ``positive_logprob``
POSITIVE_LOGPROB_TOL = 1e-4
#: largest plausible token entropy (nats): H <= ln(vocabulary size), and ln V < 20 for any
#: vocabulary below 485M entries; a larger value is garbage (a sentinel, an unnormalised
#: value, uninitialised memory), not an entropy
ENTROPY_MAX = 20.0
#: an entropy this far below 0 (nats) is floating-point rounding of a near-certain
#: distribution (float32 gives -1e-9 to -1e-7 there): a valid token, its entropy read as 0
#: (counted: Accounting.tokens_entropy_below_zero); further below it is invalid_entropy
ENTROPY_NEG_TOL = 1e-4


def missing_versions(has: Callable[[str], bool]) -> str:
    """What keeps staleness (train_version - policy_version) from being computed, as a
    phrase: ``"no train_version"``, ``"no policy_version"`` or ``"no policy_version nor
    train_version"`` (``has``: whether a canonical column is present)."""
    gone = [c for c in ("policy_version", "train_version") if not has(c)]
    return "no " + " nor ".join(gone) if gone else "no staleness column"
