"""Caveats printed beside a verdict (terminal, JSON ``verdict.caveat``, HTML summary).

Built only from a fit result's ``to_dict()`` and the token accounting: nothing is recomputed.
Pure functions of the core (the fit and the forensics use them; the renderers print them).
"""

from __future__ import annotations

from collections.abc import Mapping

#: Fewer independent resampling units than this (non-empty sequence blocks of the bootstrap;
#: whole sequences hashed into blocks, so at most the number of sequences) and the verdict
#: gets a caveat. A percentile bootstrap over m units has only C(2m-1, m) distinct resamples
#: (3 for m = 2, 35 for m = 4) and its 95% intervals cover well under 95% for small m; 30 is
#: the usual floor for a resampled mean to behave.
MIN_BOOTSTRAP_UNITS = 30


def small_sample_caveat(fit: Mapping, sequences: int | None = None) -> str | None:
    """A one-line caveat when the fit's sequence bootstrap rests on fewer than
    :data:`MIN_BOOTSTRAP_UNITS` units, else None.

    Args:
        fit: a fit result's ``to_dict()`` (``parameters.blocks_nonempty``: the non-empty
            sequence blocks the bootstrap resamples).
        sequences: the number of valid sequences (token accounting), to name in the line.
    """
    units = (fit.get("parameters") or {}).get("blocks_nonempty")
    if not isinstance(units, int) or units >= MIN_BOOTSTRAP_UNITS:
        return None
    if sequences is None or sequences == units:
        what = f"{units} sequence{'s' if units != 1 else ''}"
    else:
        what = f"{units} independent sequence blocks (of {sequences:,} sequences)"
    return (
        f"caveat: only {what} to resample (fewer than {MIN_BOOTSTRAP_UNITS}): the 95% "
        "intervals are likely too narrow and the verdict is tentative; add sequences before "
        "relying on it."
    )


#: what a reason excluding most loss-masked tokens usually means
MOSTLY_EXCLUDED_HINTS: dict[str, str] = {
    "positive_logprob": "{logprob_columns} may hold probabilities rather than "
                        "log-probabilities (entr-diag needs natural-log probabilities, <= 0)",
    "sentinel_logprob": "padding values inside the loss mask: the mask may not match the "
                        "logprob arrays (shifted, or the prompt's mask)",
    "non_finite_logprob": "one side may not have been computed for these tokens (NaN or "
                          "null), or the mask covers padding",
    "zero_placeholder": "one side holds 0.0 where it has no value (e.g. rollout logprobs "
                        "not requested from the engine)",
    "invalid_entropy": "the entropy column may hold something else (e.g. bits, logits, an "
                       "unnormalised value); map another with --column entropy=NAME",
    "invalid_loss_mask": "the mask column holds weights or labels, not 0/1; map the 0/1 mask "
                         "with --column loss_mask=NAME",
    "null_loss_mask": "the mask is null where the arrays were padded (a padded tensor with "
                      "null padding?) or the mask column is not the loss mask",
    "missing_seq_id": "the seq_id column is mostly null: map another with --column "
                      "seq_id=NAME",
    "invalid_position": "the position column is mostly null or negative (padding markers?): "
                        "map another with --column position=NAME, or drop it to number "
                        "tokens in row order",
    "negative_version": "version -1 marks prompt positions: the mask may cover the prompt",
}


def exclusion_hint(excluded: Mapping[str, int], masked: int,
                   mapping: Mapping[str, str] | None = None) -> str:
    """What the reason excluding more than half of the ``masked`` loss-masked tokens
    usually means, as a sentence ('' when no reason does); ``mapping`` (canonical column ->
    source column) names the logprob columns in it."""
    if not excluded or not masked:
        return ""
    reason, n = max(excluded.items(), key=lambda kv: kv[1])
    if n <= masked / 2 or reason not in MOSTLY_EXCLUDED_HINTS:
        return ""
    named = [f"{c} ('{mapping[c]}')" for c in ("train_logprob", "infer_logprob")
             if mapping and c in mapping]
    cols = f"one or both of {' and '.join(named)}" if len(named) == 2 else "the logprob columns"
    hint = MOSTLY_EXCLUDED_HINTS[reason].replace("{logprob_columns}", cols)
    return f"Most are {reason}: {hint}."


def exclusion_caveat(excluded: Mapping[str, int], masked: int, valid: int,
                     mapping: Mapping[str, str] | None = None) -> str | None:
    """A one-line caveat when one exclusion reason removes more than half of the loss-masked
    tokens (the results then rest on what is left, and the reason usually means the columns
    are not what they were taken for), else None.

    Args:
        excluded: tokens per exclusion reason (the token accounting's ``excluded``).
        masked: loss-masked tokens; valid: those left after the exclusions.
        mapping: canonical column -> source column, to name the columns concerned.
    """
    hint = exclusion_hint(excluded, masked, mapping)
    if not hint or not valid:
        return None
    return (f"caveat: {(masked - valid) / masked:.1%} of the loss-masked tokens are excluded, "
            f"the results rest on the {valid:,} others. {hint}")


def exclusion_lead(excluded: Mapping[str, int], masked: int, valid: int,
                   mapping: Mapping[str, str] | None = None) -> str:
    """When more than half of the ``masked`` loss-masked tokens were excluded: a sentence
    saying how many and why (the largest reasons with their counts, and what the dominant
    one usually means, :func:`exclusion_hint`), to lead a refusal of the fit with: the
    exclusions, not the few tokens left, are then what to fix. '' otherwise."""
    if not masked or masked - valid <= masked / 2:
        return ""
    out = masked - valid
    top = sorted(excluded.items(), key=lambda kv: -kv[1])
    reasons = ", ".join(f"{r} {n:,}" for r, n in top[:3]) + (", ..." if len(top) > 3 else "")
    hint = exclusion_hint(excluded, masked, mapping).removeprefix("Most are ")
    why = hint.split(": ", 1)[1] if hint else \
        "see `entr-diag inspect` for what each reason means and which columns they concern."
    return (f"{out:,} of the {masked:,} loss-masked tokens ({out / masked:.1%}) were "
            f"excluded ({reasons}): {why}")


def integer_caveat(notes: list[str] | tuple[str, ...]) -> str | None:
    """A one-line caveat when the loader read an integer-typed logprob or entropy column
    (its ``warning: CANON ('SRC') holds integers ...`` note), else None: a verdict on
    rounded or scaled log-probabilities means nothing, whatever its intervals say."""
    cols = [n.removeprefix("warning: ").split(" holds integers")[0] for n in notes
            if n.startswith("warning: ") and " holds integers " in n]
    if not cols:
        return None
    return (f"caveat: {' and '.join(cols)} {'holds' if len(cols) == 1 else 'hold'} integers "
            "(rounded or scaled values, not log-probabilities in nats): the verdict is "
            "meaningless until the dump stores them as floats.")
