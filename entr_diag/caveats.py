"""Caveats printed beside a verdict (terminal, JSON ``verdict.caveat``, HTML summary).

Built only from a fit result's ``to_dict()`` and the token accounting: nothing is recomputed.
Pure functions of the core (the fit and the forensics use them; the renderers print them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from entr_diag.aggregate import DEFAULT_BINS

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
        what = (f"{units} independent sequence blocks (of {sequences:,} sequences: the "
                "bootstrap resamples blocks of sequences grouped by a hash of their key, "
                "and two sequences can share a block)")
    return (
        f"caveat: only {what} to resample (fewer than {MIN_BOOTSTRAP_UNITS}): the 95% "
        "intervals are likely too narrow and the verdict is tentative; add sequences before "
        "relying on it."
    )


def catastrophic_caveat(fit: Mapping) -> str | None:
    """A one-line caveat when tokens with a catastrophic log-ratio (``fit["catastrophic"]``,
    :class:`entr_diag.fit.Catastrophic`: |delta| >= ln 1e4 = 9.21 nats) carry
    CATASTROPHIC_SHARE (20%) or more of the fit's sum delta^2, or the law fitted without
    them reads otherwise: the bins' mean delta^2, the law and the break are then theirs.
    Names their count, share and largest |delta|, and the verdict without them; else
    None."""
    from entr_diag.fit import CATASTROPHIC_SHARE

    c = fit.get("catastrophic") or {}
    share = c.get("delta2_share")
    if not c or not (c.get("changes") or (share is not None and share >= CATASTROPHIC_SHARE)):
        return None
    n = c["tokens"]
    changes = bool(c.get("changes"))
    if not c.get("verdict"):
        reading = ("the bins' mean delta^2 and the law may be mostly theirs; too few bins "
                   "are left to fit the law without them")
    elif changes:
        reading = ("the bins' mean delta^2, the law and any break are mostly theirs; fitted "
                   f"without them: {c['verdict']}")
    else:
        reading = ("yet the law's reading and the break are the same without them (they "
                   "sit where the law is not read, below H* or at an entropy of about 0): "
                   f"{c['verdict']}; the bins' mean delta^2 there is theirs")
    return (
        f"caveat: {n:,} token(s) ({c['token_share']:.2%} of the tokens fitted) have a "
        f"catastrophic log-ratio, |delta| >= ln 1e4 = {c['threshold']:.2f} nats (an "
        "importance ratio below 1e-4, which verl's and slime's veto reject, or above 1e4, "
        f"which IcePop and token MIS drop; up to {c['max_abs_delta']:.3g} nats), and carry "
        f"{share:.1%} of sum delta^2: {reading}. They are the tokens of the input with "
        f"|train_logprob - infer_logprob| >= {c['threshold']:.2f}: a broken kernel or cache "
        "on some sequences, or logprobs of another token?"
        + (" (The forensic checks' regressions, e.g. a temperature or truncation finding, "
           "read them too.)" if changes else ""))


def influence_caveat(fit: Mapping) -> str | None:
    """A one-line caveat when the verdict rests on a few tokens: the fit's influence check
    (``fit["influence"]``, :class:`entr_diag.fit.Influence`) found a few sequence blocks
    that each carry a tenth or more of an entropy bin's sum of delta^2, ten times their
    share of its tokens, and without them the law's reading or the break differs; else
    None."""
    inf = fit.get("influence") or {}
    if not inf.get("changes"):
        return None
    ranges = inf.get("bins_dominated") or []
    shown = ", ".join(f"{lo:.3g}-{hi:.3g}" for lo, hi in ranges[:4]) + (
        f" and {len(ranges) - 4} more" if len(ranges) > 4 else "")
    n = inf["blocks_left_out"]
    return (
        f"caveat: the verdict rests on a few tokens: {n} of the {inf['blocks_nonempty']} "
        f"sequence blocks ({inf['token_share']:.2%} of the tokens) each carry a tenth or more "
        f"of sum delta^2 in {len(ranges)} entropy bin(s) (H "
        f"{entropy_text(shown, '', fit.get('units'))}), ten times their "
        f"share of its tokens or more ({inf['delta2_share']:.1%} of the run's sum delta^2 in "
        "all): a few extreme log-ratios set those bins; fitted without "
        f"{'it' if n == 1 else 'them'}: {inf['verdict']}. Look for the extreme tokens in "
        "those bins (the sequence_outliers finding, `compare --export`): catastrophic "
        "tokens or placeholders that passed as logprobs?")


#: tokens below the law's entropy range (H < 1e-6 nats) get a caveat from this share of
#: the fit's tokens (:func:`zero_entropy_caveat`)
ZERO_ENTROPY_SHARE = 0.1


def zero_entropy_caveat(fit: Mapping) -> str | None:
    """A one-line caveat when :data:`ZERO_ENTROPY_SHARE` or more of the fit's tokens lie in
    the entropy bin below the law's range (``bins``: the first bin, ending at H_MIN = 1e-6
    nats, not ``in_fit``): an entropy of 0 is a distribution of one token (a top-p / top-k
    nucleus of one token renormalised to probability 1, a forced or greedy step), and the
    law, its reading and any noise regime describe the other tokens only. None otherwise.

    Args:
        fit: a fit result's ``to_dict()`` (``bins``: ``h_lo``, ``h_hi``, ``tokens``,
            ``mean_delta2``, ``in_fit``).
    """
    from entr_diag.aggregate import H_MIN

    bins = fit.get("bins") or []
    total = sum(int(b.get("tokens") or 0) for b in bins)
    low = [b for b in bins if not b.get("in_fit") and isinstance(b.get("h_hi"), float)
           and b["h_hi"] <= H_MIN * (1 + 1e-9)]
    n = sum(int(b.get("tokens") or 0) for b in low)
    if not total or n < ZERO_ENTROPY_SHARE * total:
        return None
    d2 = sum(float(b.get("mean_delta2") or 0.0) * int(b.get("tokens") or 0) for b in low) / n
    return (
        f"caveat: {n / total:.1%} of the tokens ({n:,}) have an entropy below {H_MIN:g} nats, "
        "a distribution of one token (a one-token top-p / top-k nucleus renormalised to "
        "probability 1, a forced step, or a near-certain token sharpened further by a low "
        "sampling temperature), below the law's range: the law, its reading and "
        f"any noise regime describe the other {1 - n / total:.1%}; their mean delta^2 is "
        f"{d2:.3g} (the bins table's first row)."
    )


def curvature_caveat(fit: Mapping) -> str | None:
    """A one-line caveat when the law's bins bend in log-log space (``laws.power.curvature``
    with ``bends``, :class:`entr_diag.fit.Curvature`), else None: alpha then averages a
    slope that changes across the fitted range, so alpha, R^2 and the verdict's reading of
    them move with where the bins lie.

    Args:
        fit: a fit result's ``to_dict()``.
    """
    power = (fit.get("laws") or {}).get("power") or {}
    c = power.get("curvature") or {}
    if not c.get("bends"):
        return None
    lo, hi = c.get("change_ci") or (None, None)
    ci = (f" [{lo:.2f}, {hi:.2f}]" if isinstance(lo, float) and isinstance(hi, float)
          else "")
    (a0, a1), (b0, b1) = c["low_range"], c["high_range"]
    units = fit.get("units")  # (an entropy column read as bits: the ranges in its unit)
    if c["change"] > 0:
        how = "mean delta^2 steepens as the entropy grows"
    elif c["slope_high"] < -BEND_FALLS:
        how = "mean delta^2 rises, then falls as the entropy grows"
    else:
        how = "mean delta^2 levels off as the entropy grows"
    return (
        f"caveat: the law's bins bend in log-log space: slope {c['slope_low']:.2f} over H "
        f"{entropy_text(f'{a0:.3g}-{a1:.3g}', '', units)} (the lowest third of the bins), "
        f"{c['slope_high']:.2f} over {entropy_text(f'{b0:.3g}-{b1:.3g}', '', units)} (the "
        f"highest; change {c['change']:.2f}{ci}): {how}, which "
        "no power law does (a bend over the range, or a step where a few tokens with a large "
        f"delta set some bins' means). alpha = {power.get('alpha', float('nan')):.2f} "
        "averages the slope over the fitted range, so alpha, R^2 and the law's reading move "
        "with where the bins lie (--bin-edges, --bins); read the bins table, not alpha "
        "alone."
    )


#: the bend caveat says mean delta^2 falls (rather than levels off) at high entropy when
#: the highest third's slope is below minus this
BEND_FALLS = 0.3


def interval_caveat(fit: Mapping) -> str | None:
    """A one-line caveat when the power law's estimate (``alpha`` or ``k``) lies outside its
    own 95% bootstrap interval, else None.

    The law is fitted to the logarithm of each bin's mean delta^2; the bootstrap resamples
    those means, and the logarithm of a mean of few heavy-tailed values is biased downward
    (Jensen), more in some bins than others, so the replicate slopes shift away from the
    estimate. With many bins (``--bins 200``) the shift can exceed the interval's width:
    the interval then describes the replicates, not the estimate, and the estimate itself
    moves with the number of bins (the caveat advises fewer bins). At the default bin count
    or fewer it means a few extreme tokens dominate some bins (the caveat points to the
    forensics).

    Args:
        fit: a fit result's ``to_dict()`` (``laws.power``: ``alpha``, ``alpha_ci``, ``k``,
            ``k_ci``; ``parameters.bins``).
    """
    power = (fit.get("laws") or {}).get("power") or {}
    outside = []
    for name in ("alpha", "k"):
        est, ci = power.get(name), power.get(f"{name}_ci")
        if (isinstance(est, float) and isinstance(ci, list | tuple) and len(ci) == 2
                and all(isinstance(c, float) and math.isfinite(c) for c in ci)
                and math.isfinite(est) and not ci[0] <= est <= ci[1]):
            outside.append(f"{name} = {est:.4g} [{ci[0]:.4g}, {ci[1]:.4g}]")
    if not outside:
        return None
    bins = (fit.get("parameters") or {}).get("bins")
    if isinstance(bins, int) and bins > DEFAULT_BINS:
        why = (f"with {bins} bins some bins hold too few tokens for the logarithm of their "
               "mean delta^2 to be unbiased, and the law shifts with the number of bins; "
               f"prefer fewer bins (--bins {DEFAULT_BINS})")
    else:  # not a matter of bin count: a few extreme tokens dominate some bins
        why = ("a few extreme tokens dominate the mean delta^2 of some bins (placeholder "
               "logprobs, outlier sequences: see the forensics), so the interval describes "
               "the resamples, not the estimate")
    return (
        f"caveat: the power law's {' and '.join(outside)} "
        f"{'lie outside their' if len(outside) > 1 else 'lies outside its'} own 95% bootstrap "
        f"interval: {why}."
    )


def implausible_caveat(findings: Mapping | None) -> str | None:
    """A one-line caveat when the forensics found impossible logprobs (at or below -50 nats) that
    bias the fit (the ``implausible_logprobs`` finding at warning or critical severity:
    they carry at least 1% of sum delta^2), else None.

    Args:
        findings: the forensics' ``to_dict()`` (``findings``: kind, severity, title), or
            None when the command ran no forensics.
    """
    for f in (findings or {}).get("findings", ()):
        if f.get("kind") == "implausible_logprobs" and f.get("severity") in ("warning",
                                                                             "critical"):
            effect = ("the law describes them, not the mismatch" if f["severity"] == "critical"
                      else "the finding gives the law with and without them")
            ev = f.get("evidence") or {}
            where = files_listed(ev.get("files") or {}, int(ev.get("input_files") or 1))
            sides = [c for c, k in (("infer_logprob", "tokens_infer_side"),
                                    ("train_logprob", "tokens_train_side")) if ev.get(k)]
            side = (f"the impossible values are in {sides[0]}" if len(sides) == 1
                    else "the impossible values are in both logprob columns" if sides else "")
            paren = "; ".join(p for p in (side, where) if p)
            return (f"caveat: {f['title']}{f' ({paren})' if paren else ''}: {effect}; "
                    "drop those rows and rerun (forensics: implausible_logprobs).")
    return None


#: what a forensic finding at warning or critical severity does to the law beside the verdict
#: (:func:`findings_caveats`); the implausible-logprob and misalignment findings have
#: caveats of their own
FINDING_CONSEQUENCES: dict[str, str] = {
    "one_sided_temperature": "delta holds the temperature's log-ratio as well as the engine "
                             "mismatch: the law's k and alpha (and any H*) describe both",
    "truncated_sampling": "delta holds the truncation's bias, which grows with entropy: the "
                          "law's k and alpha, and any H* and noise regime, are distorted by it "
                          "(the finding gives the law on de-biased delta)",
    "sequence_outliers": "a few sequences carry much of sum delta^2: the finding gives the "
                         "law's k without them",
    "drift": "the mismatch changes over the run: the pooled law averages it (read the strata "
             "per step range)",
    "staleness": "delta mixes policy change with engine mismatch: read the law per staleness "
                 "bucket",
    "unsampled_tokens": "the loss mask holds tokens the engine did not sample (or the "
                        "logged distribution is not the one that sampled): at low entropy "
                        "they set the bins' mean delta^2, so alpha, H* and any noise regime "
                        "describe them",
    "mask_start_surprisal": "the loss mask holds tokens the engine did not sample at its "
                            "start (the prompt, or the last prompt token): their delta is no "
                            "engine mismatch, and the law's bins mix them in",
    "corrupt_rows": "the excluded rows form patterns of the dump or the mask, not noise: the "
                    "law rests on the rows left",
    # (the corrupt-rows finding for bad tokens scattered at random: its evidence holds
    # scattered_token_share)
    "corrupt_rows_scattered": "the excluded tokens are scattered through the sequences, not "
                              "a pattern: the law rests on the rows left, unbiased only if "
                              "what made them invalid is unrelated to delta",
    # (excluded tokens mostly both logprobs 0.0: evidence both_zero_only, or
    # placeholder_tokens_both_zero for half or more of the scattered ones)
    "corrupt_rows_both_zero": "the excluded tokens with both logprobs exactly 0.0 measure no "
                              "mismatch (delta 0 by construction: zero-filled, one-token "
                              "nuclei or a bf16 log-softmax on both sides): the law rests on "
                              "the rows left; if they are real tokens, the low-entropy bins "
                              "are thinned",
}
#: findings whose caveat is written elsewhere (:func:`implausible_caveat`, the misalignment
#: caveat of the CLI)
_OWN_CAVEAT = ("implausible_logprobs", "misalignment")


def findings_caveats(findings: Mapping | None, gates: bool = False) -> list[str]:
    """One ``caveat:`` line per forensic finding at warning or critical severity (but the
    implausible-logprob and misalignment findings, which have their own): its title, kind
    and what it does to the law (:data:`FINDING_CONSEQUENCES`), so that the verdict never
    stands alone beside a cause that distorts it (e.g. a top-k engine whose truncation bias
    reads as a law with alpha 3 and a noise regime).

    Args:
        findings: the forensics' ``to_dict()`` (``findings``: kind, severity, title), or
            None when the command ran no forensics.
        gates: for ``compare``, which shows no finding: each line also says that the
            gates' noise and exploration categories rest on the law, and where the finding
            is shown.
    """
    out = []
    for f in (findings or {}).get("findings", ()):
        kind = f.get("kind")
        if f.get("severity") not in ("warning", "critical") or kind in _OWN_CAVEAT:
            continue
        ev = f.get("evidence") or {}
        scattered = kind == "corrupt_rows" and "scattered_token_share" in ev
        both_zero = kind == "corrupt_rows" and (ev.get("both_zero_only") or (
            scattered and 2 * int(ev.get("placeholder_tokens_both_zero") or 0)
            >= int(ev.get("scattered_bad_tokens") or 0) > 0))
        effect = FINDING_CONSEQUENCES.get(
            f"{kind}_both_zero" if both_zero else f"{kind}_scattered" if scattered else kind,
            "read the finding before the law")
        tail = (" The gates' noise admitted and exploration discarded rest on that law; "
                "`entr-diag fit` or `entr-diag report` shows the finding." if gates else "")
        out.append(f"caveat: {f.get('title', kind)} [{kind}]: {effect}.{tail}")
    return out


def _alike(spread: float) -> str:
    """How close the units check's per-bin ratios are (``spread``: the ninth over the first
    decile after the sampling-noise discount, >= 1): "within a factor 1.12 of each other",
    or, when the discount leaves no spread, "equal once their sampling noise is discounted"
    (helper-38: "within a factor 1")."""
    if spread < 1.005:
        return "equal once their sampling noise is discounted"
    return f"within a factor {spread:.3g} of each other"


def forensics_summary(findings: Mapping | None, void: str | None = None) -> str | None:
    """One line under the verdict on what the mismatch forensics found (``findings``: their
    ``to_dict()`` with ``checks``; None, or a dict without checks such as ``compare``'s
    list of findings: None): the findings at critical and warning severity by kind, or,
    when none is above info, that no known cause of mismatch was found, with how many
    checks read clear, which found info only and which cannot tell. A law that does not
    hold on a run without a finding is then read as the run's own shape, not a fault the
    forensics know (helper-34 F7: a clean bf16 run read "law does not hold" with nothing
    beside it to say so). ``void``: why the verdict is not assessable (a unit mistake, a
    shifted entropy column, ...): then no other cause was found besides that one."""
    if not findings or not findings.get("checks"):
        return None
    fs = findings.get("findings", ())
    checks = findings.get("checks", {})
    kinds = {s: list(dict.fromkeys(f.get("kind", "?") for f in fs if f.get("severity") == s))
             for s in ("critical", "warning", "info")}
    if kinds["critical"] or kinds["warning"]:
        parts = [f"{len(kinds[s])} {s}{'s' if len(kinds[s]) > 1 else ''} "
                 f"({', '.join(kinds[s])})" for s in ("critical", "warning") if kinds[s]]
        return (f"Forensics: {' and '.join(parts)}: see the caveats and the findings.")
    clear = sum(c.get("status") == "clear" for c in checks.values())
    cannot = [n for n, c in checks.items() if c.get("status") == "cannot_tell"]
    tail = [f"{clear} of {len(checks)} checks clear"]
    if kinds["info"]:
        tail.append(f"info only: {', '.join(kinds['info'])}")
    if cannot:
        tail.append(f"cannot tell: {', '.join(cannot)}")
    if void:
        return (f"Forensics: no cause of mismatch found besides the caveat's ({void}; "
                f"{'; '.join(tail)}).")
    return f"Forensics: no known cause of mismatch found ({'; '.join(tail)})."


def truncation_metrics_note(findings: Mapping | list | None) -> str | None:
    """The note under the mismatch metrics when the forensics found engine-side truncated
    sampling at warning severity or above (``findings``: the forensics' ``to_dict()``, or
    its list of findings), else None: the metrics then measure the support the engine cut,
    not engine noise (the truncated-sampling finding explains it; its message says the
    same, but a reader of the metrics table alone would not see it)."""
    fs = findings.get("findings", ()) if isinstance(findings, Mapping) else (findings or ())
    if not any(f.get("kind") == "truncated_sampling"
               and f.get("severity") in ("warning", "critical") for f in fs):
        return None
    return ("The engine samples from a truncated support (top-p / top-k / min-p; the "
            "truncated_sampling finding): these metrics measure that support difference, not "
            "engine noise (the trainer puts a mass Z < 1 on the engine's support: kl is about "
            "-ln Z, chi2_token about Z^2 - 1, chi2_seq near -1 on long sequences, ess about 1).")


#: what a reason excluding most loss-masked tokens usually means
MOSTLY_EXCLUDED_HINTS: dict[str, str] = {
    "positive_logprob": "{logprob_columns} may hold probabilities rather than "
                        "log-probabilities (entr-diag needs natural-log probabilities, <= 0)",
    "sentinel_logprob": "padding values inside the loss mask: the mask may not match the "
                        "logprob arrays (shifted, or the prompt's mask)",
    "non_finite_logprob": "one side may not have been computed for these tokens (NaN, "
                          "null or infinite), or the mask covers padding, or it is inverted "
                          "(true on the prompt, whose rows hold no logprobs)",
    "zero_placeholder": "one side, or both, hold 0.0 where they have no value (e.g. rollout "
                        "logprobs not requested from the engine, rows zero-filled in the "
                        "dump)",
    "invalid_entropy": "{entropy_column} holds no value (null or NaN) for these tokens, or "
                       "no entropy in nats (negative or above 20 nats: bits, logits, an "
                       "unnormalised value?); {entropy_fix}",
    "invalid_loss_mask": "the mask column holds weights or labels, not 0/1; map the 0/1 mask "
                         "with --column loss_mask=NAME",
    "null_loss_mask": "the mask is null where the arrays were padded (a padded tensor with "
                      "null padding?), the mask column was never filled (null in every row, "
                      "e.g. set to None in pandas: drop it to count every token) or it is "
                      "not the loss mask",
    "missing_seq_id": "the seq_id column is mostly null (or floating-point values with a "
                      "fraction, which read as null): map another with --column "
                      "seq_id=NAME",
    "invalid_position": "the position column is mostly null or negative (padding markers? "
                        "or floating-point values with a fraction, which read as null): "
                        "map another with --column position=NAME, or drop it to number "
                        "tokens in row order",
    "negative_version": "a version of -1 marks prompt tokens (AReaL numbers them so), one "
                        "far below the others (e.g. -9999) an unknown version, yet these "
                        "have valid logprobs: the mask may cover the prompt, or -1 is a "
                        "real version (step - lag at the start of an asynchronous run: "
                        "number the versions from 0 to keep those tokens)",
}

#: the hint instead when the reason's values are all in one logprob column: a placeholder
#: on one side only says that side had no value, rather than that the mask is shifted
ONE_SIDE_HINTS: dict[str, str] = {
    "sentinel_logprob": "{logprob_columns} holds a placeholder (e.g. -9999) for these tokens: "
                        "that side returned no logprob for them (not requested, or cut "
                        "short), or its array is padded where the loss mask expects tokens",
}


#: the hint instead when no loss mask is mapped (no mask can cover padding; the padding of
#: padded tensors is named apart, :func:`_hinted`)
NO_MASK_HINTS: dict[str, str] = {
    "non_finite_logprob": "one side, or both, may not have been computed for these tokens "
                          "(NaN, null or infinite)",
}


#: the share of the loss-masked tokens from which a reason's exclusions get their hint,
#: for the reasons that are never legitimate (others: more than half): a probability above
#: 1; an entropy that is NaN, null or out of range (e.g. one shard of two written without
#: it, while a trainer-side entropy could be used); a mask value other than 0 or 1 (a loss
#: weight column mapped as the mask, e.g. in one shard of four); a version of -1 on tokens
#: with valid logprobs (a prompt marker inside the mask, or a real version)
HINT_MIN_SHARE: dict[str, float] = {"positive_logprob": 0.01, "invalid_entropy": 0.05,
                                    "invalid_loss_mask": 0.05, "negative_version": 0.01}


#: input files named at most in where the excluded rows are
_MAX_FILES_NAMED = 3


def hinted_reason(excluded: Mapping[str, int], masked: int,
                  mapping: Mapping[str, str] | None = None) -> str | None:
    """The exclusion reason the warnings explain (:func:`exclusion_hint`): the largest one
    above its share of the ``masked`` loss-masked tokens (:data:`HINT_MIN_SHARE`, else more
    than half) that has a hint; None when none has."""
    if not excluded or not masked:
        return None
    hinted = [r for r, n in sorted(excluded.items(), key=lambda kv: -kv[1])
              if r in MOSTLY_EXCLUDED_HINTS and n > masked * HINT_MIN_SHARE.get(r, 0.5)]
    return hinted[0] if hinted else None


def column_named(canon: str, mapping: Mapping[str, str] | None) -> str:
    """A canonical column as the user knows it: ``canon ('source')`` when mapped from
    another source column, else ``canon`` alone."""
    src = (mapping or {}).get(canon, canon)
    return canon if src == canon else f"{canon} ('{src}')"


def files_listed(files: Mapping[str, int], input_files: int) -> str:
    """Where some rows are among ``input_files`` input files ('' for one input file or
    none listed): ``files``, path -> rows, e.g. "all in a.parquet, 1 of the 8 input
    files" or "in 2 of the 8 input files: a.parquet (2,000), b.parquet (10)" (the three
    with most rows, and how many more)."""
    if not files or input_files <= 1:
        return ""
    top = sorted(files.items(), key=lambda kv: (-kv[1], kv[0]))
    if len(top) == 1:
        return f"all in {top[0][0]}, 1 of the {input_files:,} input files"
    listed = ", ".join(f"{f} ({n:,})" for f, n in top[:_MAX_FILES_NAMED])
    more = f" and {len(top) - _MAX_FILES_NAMED:,} more" if len(top) > _MAX_FILES_NAMED else ""
    return f"in {len(top):,} of the {input_files:,} input files: {listed}{more}"


def _hint_text(reason: str, mapping: Mapping[str, str] | None,
               sides: Sequence[str] = ()) -> tuple[str, str, bool]:
    """(what ``reason`` excluding most rows usually means, :data:`MOSTLY_EXCLUDED_HINTS`
    (:data:`ONE_SIDE_HINTS` when its values are in one logprob column) with the columns
    named, the logprob columns named, whether that text names them): ``sides``, the
    logprob columns the reason's values are in (when known). A column is named as ``train_logprob ('source')`` when mapped from
    another name, else by its name alone."""
    named = [column_named(c, mapping) for c in (sides or ("train_logprob", "infer_logprob"))
             if mapping and c in mapping]
    cols = (named[0] if sides and len(named) == 1
            else f"both {' and '.join(named)}" if sides and len(named) == 2
            else f"one or both of {' and '.join(named)}" if len(named) == 2
            else "the logprob columns")
    src, train = (mapping or {}).get("entropy"), (mapping or {}).get("train_entropy")
    fix = "map another with --column entropy=NAME"
    if train and train != src:  # a trainer-side entropy that is not the one excluded
        fix = f"use the trainer-side entropy ('{train}') with --entropy train, or {fix}"
    hint = (ONE_SIDE_HINTS.get(reason, MOSTLY_EXCLUDED_HINTS[reason]) if len(sides) == 1
            else MOSTLY_EXCLUDED_HINTS[reason])
    if mapping is not None and "loss_mask" not in mapping:
        hint = NO_MASK_HINTS.get(reason, hint)
    text = (hint.replace("{logprob_columns}", cols)
            .replace("{entropy_column}", f"the entropy column{f' ({src!r})' if src else ''}")
            .replace("{entropy_fix}", fix))
    return text, cols, "{logprob_columns}" in hint


def file_exclusion_warnings(by_file: Mapping[str, Mapping[str, tuple[int, int]]],
                            n_files: int, mapping: Mapping[str, str] | None = None,
                            skip: str | None = None,
                            where: Mapping[str, Mapping[str, Any]] | None = None) -> list[str]:
    """One sentence per exclusion reason that excludes 20% or more of the loss-masked rows of
    some input files (``by_file``: the accounting's ``file_exclusions``, reason -> {path:
    (excluded, loss-masked)}; ``n_files`` input files), naming the files (the three with
    most rows, and how many more) and what the reason usually means; none for ``skip``
    (the reason the pooled warning already explains, naming its files); ``where`` (the
    accounting's ``excluded_where``) names the logprob column a reason's values are in. A
    small shard broken on its own is otherwise only a count among the exclusions."""
    out = []
    for reason, files in by_file.items():
        if reason == skip or reason not in MOSTLY_EXCLUDED_HINTS or not files:
            continue
        top = sorted(files.items(), key=lambda kv: (-kv[1][0], kv[0]))
        listed = "; ".join(f"{f}: {e:,} of {m:,} rows" for f, (e, m) in top[:_MAX_FILES_NAMED])
        more = (f" and {len(top) - _MAX_FILES_NAMED:,} more" if len(top) > _MAX_FILES_NAMED
                else "")
        at = (where or {}).get(reason) or {}
        sides, few = _sides(at)
        text, cols, named = _hint_text(reason, mapping, sides)
        if sides and not named:
            text += f" ({_values_in(reason, cols, sides, few)}{f'; {few}' if few else ''})"
        elif few:
            text += f" ({few})"
        if reason == "zero_placeholder":  # what the exclusion cannot catch
            text += ("; rows whose other side is within 0.05 nats of 0 stay valid (they cannot "
                     "be told from near-certain tokens) and enter the results with the zeros")
        k = len(top)
        share = min(e / m for _f, (e, m) in top)
        how = ("most of" if share > 0.5 else f"{share:.0%} of" if k == 1
               else f"{share:.0%} or more of")
        out.append(f"{k:,} of the {n_files:,} input files lose{'s' if k == 1 else ''} {how} "
                   f"{'its' if k == 1 else 'their'} loss-masked rows to {reason} "
                   f"({listed}{more}): {text}.")
    return out


def starved_files_warning(starved: Mapping[str, Mapping[str, Any]], n_files: int) -> str | None:
    """A sentence naming the input files that contribute few or no valid tokens (``starved``:
    the accounting's ``starved_files``; ``n_files`` input files), with what their rows are
    (outside the loss mask, excluded by reason) and what it usually means; None when none."""
    if not starved:
        return None
    top = sorted(starved.items(), key=lambda kv: (-kv[1]["rows"], kv[0]))
    parts = []
    for f, v in top[:_MAX_FILES_NAMED]:
        ex = v.get("excluded") or {}
        n_ex = sum(ex.values())
        what = [f"{v['outside_mask']:,} outside the loss mask"] if v["outside_mask"] else []
        if n_ex:
            listed = ", ".join(f"{r} {n:,}" for r, n in
                               sorted(ex.items(), key=lambda kv: -kv[1])[:3])
            what.append(f"{n_ex:,} excluded ({listed})")
        parts.append(f"{f}: {v['valid']:,} valid of {v['rows']:,} rows"
                     + (f", {', '.join(what)}" if what else ""))
    more = (f"; {len(top) - _MAX_FILES_NAMED:,} more" if len(top) > _MAX_FILES_NAMED else "")
    k = len(top)
    share = min(v["others_share"] for _, v in top)
    none = all(v["valid"] == 0 for _, v in top)
    return (f"{k:,} of the {n_files:,} input files contribute{'s' if k == 1 else ''} "
            f"{'no' if none else 'few'} valid tokens, where the other files' rows are "
            f"{share:.0%} valid ({'; '.join(parts)}{more}): "
            f"{'its' if k == 1 else 'their'} loss mask may be inverted, all false or not the "
            "loss mask (an attention mask?), or the file holds no trained tokens; check "
            "--column loss_mask=NAME.")


def position_wrap_caveat(notes: Sequence[str]) -> str | None:
    """The loader's warning that an 8- or 16-bit position column wrapped past its maximum
    (:func:`entr_diag.io.load._position_wrap`) as a caveat beside the verdict, before the
    duplicate-position one it explains; None without it."""
    for n in notes:
        if n.startswith("warning: position") and " wrap " in n:
            return "caveat: " + n.removeprefix("warning: ")
    return None


def duplicates_caveat(acc: Any, n_files: int) -> str | None:
    """A one-line caveat when sequences hold duplicated (step, seq_id, position) rows
    (``acc``: the token accounting; ``n_files`` input files), naming the files holding
    them; None when none do. Their tokens count more than once in every result."""
    n = int(getattr(acc, "sequences_with_duplicate_positions", 0) or 0)
    if not n:
        return None
    where = files_listed(getattr(acc, "duplicate_position_files", None) or {}, n_files)
    return (f"caveat: {n:,} sequence(s) hold the same (step, seq_id, position) more than once"
            + (f" ({where})" if where else "")
            + ": either rows written twice (a copied shard), whose tokens then count twice "
            "in every result, or a seq_id shared by several sequences (a prompt or group id "
            "such as verl's uid), which merges them into one for every per-sequence "
            "result (resampling, sequence gates, outliers); see the warning.")


def separate_blocks(acc: Any, n_files: int = 1) -> tuple[int, int, int] | None:
    """(sequence keys, blocks, rows) when, without a position column, enough sequence keys
    have their rows in several separate blocks of long runs (``acc``: the token
    accounting, its ``sequences_in_separate_blocks``; thresholds SPLIT_MIN_KEYS,
    SPLIT_MIN_RUN, SPLIT_MIN_SHARE of :mod:`entr_diag.io.load`): different sequences
    sharing a seq_id; else None, also when :func:`across_files_caveat` says it already
    (``n_files`` input files: ids restarting in each file, read together)."""
    from entr_diag.io.load import SPLIT_MIN_KEYS, SPLIT_MIN_RUN, SPLIT_MIN_SHARE

    if across_files_caveat(acc, n_files) is not None:
        return None
    keys, blocks, rows = getattr(acc, "sequences_in_separate_blocks", None) or (0, 0, 0)
    total = int(getattr(acc, "tokens_total", 0) or 0)
    if (keys >= SPLIT_MIN_KEYS and blocks and rows >= SPLIT_MIN_RUN * blocks
            and rows >= SPLIT_MIN_SHARE * total):
        return keys, blocks, rows
    return None


def separate_blocks_caveat(acc: Any, n_files: int = 1) -> str | None:
    """A one-line caveat for :func:`separate_blocks`; None when it does not apply."""
    got = separate_blocks(acc, n_files)
    if got is None:
        return None
    keys, blocks, rows = got
    return (f"caveat: {keys:,} sequence(s) have their rows in several separate blocks "
            f"({blocks:,} blocks of {rows / blocks:,.0f} rows on average, other sequences' "
            "rows between them) and the input has no position column: probably different "
            "sequences sharing a seq_id (a per-step or per-rank sample index), "
            "merged into one for every per-sequence result (resampling, sequence gates, "
            "per-sequence metrics, outliers); see the warning.")


def across_files_caveat(acc: Any, n_files: int) -> str | None:
    """A one-line caveat when, without a position column, more sequence keys continue from
    one input file into a later one than the ``n_files - 1`` file boundaries could split
    (``acc``: the token accounting, its ``sequences_across_files``): seq_ids repeating
    across files (per-rank local indices) merge different sequences; None otherwise."""
    n = int(getattr(acc, "sequences_across_files", 0) or 0)
    if n <= max(n_files - 1, 0):
        return None
    return (f"caveat: {n:,} sequence(s) continue from one input file into a later one, more "
            f"than the {n_files - 1:,} file boundaries could split: their seq_ids probably "
            "repeat across files (per-rank local indices), which merges different sequences "
            "into one for every per-sequence result (resampling, sequence gates, per-sequence "
            "metrics, outliers); see the warning.")


def file_exclusions_caveat(acc: Any, n_files: int,
                           mapping: Mapping[str, str] | None = None) -> str | None:
    """A one-line caveat when an exclusion reason removes 20% or more of some input files'
    loss-masked rows (``acc``: the token accounting, its ``file_exclusions``) without the
    pooled caveat explaining it (:func:`exclusion_caveat`): the results rest on those
    files' other rows and on the other files; None otherwise."""
    by_file = getattr(acc, "file_exclusions", None) or {}
    skip = hinted_reason(acc.excluded, acc.tokens_masked, mapping)
    shown = {r: f for r, f in by_file.items() if r != skip and f}
    if not shown:
        return None
    parts = [f"{r}: {files_listed({p: e for p, (e, _m) in f.items()}, n_files)}"
             for r, f in sorted(shown.items(), key=lambda kv: -sum(e for e, _ in
                                                                     kv[1].values()))]
    return (f"caveat: some input files lose 20% or more of their loss-masked rows to an "
            f"exclusion ({'; '.join(parts)}): the results rest on their other rows and on "
            "the other files (see the warning).")


def step_ranges(steps: Sequence[int]) -> str:
    """Steps as ranges of consecutive values: ``[3, 5, 6, 7]`` -> ``"3, 5-7"`` (the first
    six ranges, then how many more)."""
    runs: list[list[int]] = []
    for st in sorted(set(int(x) for x in steps)):
        if runs and st == runs[-1][1] + 1:
            runs[-1][1] = st
        else:
            runs.append([st, st])
    shown = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:6]]
    return ", ".join(shown) + (f" and {len(runs) - 6:,} more ranges" if len(runs) > 6 else "")


def _identical_where(ident: Mapping[str, Any], n_files: int) -> str:
    """The input files and steps of the accounting's ``identical_logprobs``, with their
    identical and valid tokens: "1 of the 4 input files (a.parquet: 25,000 of 25,000
    tokens)", "steps 15-19 (15,000 of 15,000 tokens)"."""
    parts = []
    files = sorted(ident.get("files") or [], key=lambda d: (-d["identical"], d["file"]))
    if files:
        listed = "; ".join(f"{d['file']}: {d['identical']:,} of {d['tokens']:,} tokens"
                           for d in files[:_MAX_FILES_NAMED])
        more = (f" and {len(files) - _MAX_FILES_NAMED:,} more" if len(files) > _MAX_FILES_NAMED
                else "")
        parts.append(f"{len(files):,} of the {n_files:,} input files ({listed}{more})")
    steps = ident.get("steps") or []
    if steps:
        n_same, n_tok = sum(d["identical"] for d in steps), sum(d["tokens"] for d in steps)
        parts.append(f"step{'s' if len(steps) > 1 else ''} "
                     f"{step_ranges([d['step'] for d in steps])}"
                     + (" of the other files" if files else "")
                     + f" ({n_same:,} of {n_tok:,} tokens)")
    return " and ".join(parts)


#: what makes train_logprob equal infer_logprob on every token (fit's refusal, inspect's
#: warning)
ALL_IDENTICAL_CAUSES = ("a bitwise on-policy run, or the trainer's column copied from the "
                        "rollout's logprobs where old logprobs are not recomputed")


def identical_logprobs_warning(ident: Mapping[str, Any] | None, n_files: int,
                               mapping: Mapping[str, str] | None = None) -> str | None:
    """A sentence when train_logprob equals infer_logprob exactly on much of the valid
    tokens of some input files or steps (20% or more: IDENTICAL_SHARE) while the rest of the input has real mismatch
    (``ident``: the accounting's ``identical_logprobs``; ``n_files`` input files): where,
    how many tokens, what it usually means and its effect on the law and the gates (k
    about ``1 - share`` times the rest's when their entropies are like the others'); None
    when ``ident`` is None."""
    if not ident:
        return None
    n, valid = int(ident["tokens"]), int(ident["tokens_valid"]) or 1
    share = n / valid
    train, infer = column_named("train_logprob", mapping), column_named("infer_logprob", mapping)
    files, steps = ident.get("files") or [], ident.get("steps") or []
    fix, where = [], []
    if files:
        fix.append("pass only the other files")
        where.append("by the rank that wrote " + ("that file" if len(files) == 1
                                                   else "those files"))
    if steps:
        fix.append("drop those steps from the input (e.g. filter the Parquet files on "
                   "the step column)")
        where.append("for those steps")
    return (f"{train} equals {infer} exactly (delta = 0) on {n:,} of the {valid:,} valid "
            f"tokens ({share:.0%}), concentrated in "
            f"{_identical_where(ident, n_files)}, where the rest of the input has real "
            f"mismatch (delta = 0 on {ident['others_share']:.2%} of its tokens). The "
            "trainer's column was probably copied from the rollout's logprobs there (old "
            f"logprobs not recomputed {' or '.join(where)}, or the same column dumped "
            "twice). The law's k and the gates' statistics average in these tokens, which "
            f"have no mismatch: k reads about {share:.0%} low if their entropies are like "
            f"the other tokens'. To leave them out, {' and '.join(fix)}.")


def identical_logprobs_caveat(acc: Any, n_files: int,
                              mapping: Mapping[str, str] | None = None) -> str | None:
    """A one-line caveat when train_logprob equals infer_logprob exactly on 20% or more of
    the valid tokens of some input files or steps (``acc``: the token accounting, its
    ``identical_logprobs``; ``n_files`` input files; ``mapping`` names the source
    columns), naming them; None otherwise."""
    ident = getattr(acc, "identical_logprobs", None)
    if not ident:
        return None
    share = int(ident["tokens"]) / (int(ident["tokens_valid"]) or 1)
    train, infer = column_named("train_logprob", mapping), column_named("infer_logprob", mapping)
    return (f"caveat: {train} equals {infer} exactly on {share:.0%} of the valid "
            f"tokens, in {_identical_where(ident, n_files)}: trainer logprobs not recomputed "
            f"there? The law's k (about {share:.0%} low at like entropies) and the gates' "
            "statistics average in tokens with no mismatch (see the warning).")


def unreadable_caveat(skipped: Sequence[tuple[str, str]], n_files: int) -> str | None:
    """A one-line caveat when input files were left out as unreadable (``skipped``: the
    Dataset's ``skipped_unreadable``, (path, why); ``n_files`` files were read), naming the
    first; None when none was."""
    if not skipped:
        return None
    more = f" and {len(skipped) - 1:,} more" if len(skipped) > 1 else ""
    return (f"caveat: {len(skipped):,} input file(s) were left out, unreadable as Parquet "
            f"(--skip-unreadable: {skipped[0][0]}{more}): the results rest on the other "
            f"{n_files:,} file(s).")


def starved_caveat(acc: Any, n_files: int) -> str | None:
    """A one-line caveat when input files contribute no or few valid tokens because their
    rows are outside the loss mask (``acc``: the token accounting), naming them; None
    when none does. The results leave those files out."""
    starved = getattr(acc, "starved_files", None) or {}
    if not starved:
        return None
    listed = files_listed({f: v["rows"] for f, v in starved.items()}, n_files)
    return (f"caveat: {len(starved):,} input file(s) contribute no or few valid tokens, their "
            f"rows being outside the loss mask ({listed}): the results leave them out; check "
            "their loss mask (see the warning).")


#: positive logprobs read as negative log-likelihoods rather than probabilities when this
#: share of them is above 1 (no probability is; -logprob is above 1 for every token less
#: likely than 1/e: 20% to 40% of a real run's)
ABOVE_ONE_SHARE = 0.05


#: a logprob column is named as holding an exclusion reason's values when it holds at least
#: this share of the other column's count of them: a few positive rounding values in a
#: column of logprobs do not make "both columns hold probabilities" (helper-31 F1)
SIDE_MIN_SHARE = 0.05


def _sides(at: Mapping[str, Any]) -> tuple[list[str], str]:
    """(the logprob columns holding an exclusion reason's values, in train, infer order; a
    note on the few values in the other column, '' when none): ``at``, the reason's
    ``excluded_where`` entry (its ``columns``: canonical column -> rows)."""
    cols = {c: int(n) for c, n in (at.get("columns") or {}).items()
            if c in ("train_logprob", "infer_logprob") and n}
    if not cols:
        return [], ""
    top = max(cols.values())
    sides = [c for c in ("train_logprob", "infer_logprob")
             if c in cols and cols[c] >= SIDE_MIN_SHARE * top]
    few = [f"in {cols[c]:,} of these rows, {c} too" for c in ("train_logprob", "infer_logprob")
           if c in cols and c not in sides]
    return sides, (few[0] if few else "")


#: what makes a row excluded for a logprob reason, named where the exclusion hint says
#: which column holds it
_VALUES_OF: dict[str, str] = {"non_finite_logprob": "NaN, null or infinite values",
                              "sentinel_logprob": "placeholder values",
                              "positive_logprob": "values above 0",
                              "zero_placeholder": "0.0 placeholders"}


def _values_in(reason: str, cols: str, sides: Sequence[str], few: str) -> str:
    """"the NaN or null values are in infer_logprob only": which logprob column(s) ``cols``
    hold a reason's values (named, :data:`_VALUES_OF`: helper-48 read "the values are in
    X" as the good ones); "only" for one column with no ``few`` in the other."""
    return (f"the {_VALUES_OF.get(reason, 'excluding values')} are in {cols}"
            + (" only" if len(sides) == 1 and not few else ""))


def _hinted(excluded: Mapping[str, int], masked: int, mapping: Mapping[str, str] | None,
            where: Mapping[str, Mapping[str, Any]] | None = None
            ) -> tuple[str, int, str] | None:
    """(reason, tokens, what it usually means) for the largest reason that gets a hint
    (:func:`exclusion_hint`), else None. ``where`` (the accounting's ``excluded_where``)
    names the logprob column(s) the reason concerns and the input files holding its rows
    (when there are several input files)."""
    reason = hinted_reason(excluded, masked, mapping)
    if reason is None:
        return None
    n = excluded[reason]
    at = (where or {}).get(reason) or {}
    sides, few = _sides(at)
    text, cols, named = _hint_text(reason, mapping, sides)
    ones = int(at.get("ones") or 0)
    if reason == "positive_logprob" and ones == n:  # +1.0 placeholders, not probabilities
        named = True
        text = (f"{cols} {'holds' if len(sides) == 1 else 'hold'} +1.0 where "
                f"{'it has' if len(sides) == 1 else 'they have'} no value (every one of "
                "these rows is exactly 1.0: a placeholder, not probabilities)")
    elif reason == "positive_logprob" and ones > n / 2:
        text += f" ({ones:,} of these rows are exactly 1.0: a placeholder)"
    elif reason == "positive_logprob" and int(at.get("above_one") or 0) >= ABOVE_ONE_SHARE * n:
        named = True  # no probability is above 1: logprobs with the sign flipped
        text = (f"{cols} {'holds' if len(sides) == 1 else 'hold'} values above 1 in "
                f"{int(at['above_one']):,} of these rows, which no probability is: negative "
                "log-likelihoods (-logprob, >= 0)? Negate "
                + ("the column" if len(sides) == 1 else "the columns"))
    if (reason in ("zero_placeholder", "sentinel_logprob", "non_finite_logprob")
            and mapping is not None and "loss_mask" not in mapping and n < masked):
        # the padding of padded tensors dumped without their mask (recognised as such only
        # with an entropy column: its exact 0 marks it); not when every row has the value
        # (a tensor is never all padding: helper-31 F4, an all-NaN file)
        text += ("; or the padding of padded tensors: no loss mask is mapped, so every row "
                 "counts as a token; map it with --column loss_mask=NAME"
                 + ("" if "entropy" in mapping else
                    " (with an entropy column, padding is recognised and set aside)"))
    details = []
    if sides and not named:
        details.append(_values_in(reason, cols, sides, few))
    if few:
        details.append(few)
    if at.get("kinds"):  # what the invalid entropies are
        details.append("the values: " + ", ".join(f"{n:,} {k}" for k, n in at["kinds"].items()))
    scale = entropy_scale_seen(at)
    if scale is not None:
        details.append(entropy_scale_text(at["above_range"], mapping))
    files = files_listed(at.get("files") or {}, int(at.get("input_files") or 1))
    if files:
        details.append(f"these rows are {files}")
    if details:
        text += f" ({'; '.join(details)})"
    left_in = at.get("valid_left") or {}
    left = sum(left_in.values())
    if left and reason == "positive_logprob" and not (
            int(at.get("above_one") or 0) >= ABOVE_ONE_SHARE * n):  # (p <= 1e-4 reads ~0 nats)
        if int(at.get("input_files") or 1) == 1:
            where_left, fix = "", ("convert the column" if len(sides) == 1 else
                                   "convert the columns") + " (the log of each probability)"
        elif len(left_in) == 1:
            where_left, fix = f" in {next(iter(left_in))}", "leave that file out"
        else:
            where_left, fix = f" in those {len(left_in):,} files", "leave those files out"
        text += (f"; the {left:,} valid token{'' if left == 1 else 's'} left{where_left} "
                 f"{'is' if left == 1 else 'are'} probably probabilities too (at most 1e-4, "
                 f"which pass as log-probabilities near 0 nats) and distort the results: {fix}")
    return reason, n, text


#: an entropy column reads as scaled by a constant (:func:`entropy_scaled`,
#: :func:`entropy_scale_seen`) when its mean is this many times its tokens' mean surprisal
#: or more (or less: divided): x2 is a sum over two ranks; bits (x1.44) are named as a unit
#: first; a temperature or truncation the logs leave out moves the ratio as far (0.57 at
#: T = 0.7, 1.63 for the top-20 logprobs' entropy) but bends it with the entropy, which
#: the flatness rule tells apart (:func:`entropy_scaled`) ...
ENTROPY_SCALE_MIN_FACTOR = 1.6
#: ... and, above 20 nats, the two correlate this much or more over those rows (the bundled run's entropy
#: x10, x100, x1000: 0.34, 0.57, 0.63 over the rows it puts above 20 nats; a sampled
#: token's logit correlates negatively with its surprisal)
ENTROPY_SCALE_MIN_CORR = 0.2


def entropy_scale_seen(at: Mapping[str, Any] | None) -> float | None:
    """The factor an entropy column looks multiplied by, from the rows it puts above 20
    nats (``at``: the ``invalid_entropy`` entry of the accounting's ``excluded_where``,
    its ``above_range`` from :func:`entr_diag.io.load._above_range`), else None.

    A token drawn from a distribution has that distribution's entropy as its expected
    surprisal, E[-log mu(y) | H] = H (METHOD.md), for any selection of tokens by H: so
    over the rows above range, mean(H) / mean(-infer_logprob) reads the factor c of an
    entropy column holding c x H. Named when it is ENTROPY_SCALE_MIN_FACTOR or more over
    MIN_UNIT_TOKENS rows or more, with H and the surprisal correlated by
    ENTROPY_SCALE_MIN_CORR (values that are no entropy, e.g. logits, follow the surprisal
    at no scale)."""
    ar = (at or {}).get("above_range") or {}
    rows, mh, ms = ar.get("rows", 0), ar.get("mean_entropy"), ar.get("mean_surprisal")
    corr = ar.get("corr")
    if (rows < MIN_UNIT_TOKENS or mh is None or not ms or ms <= 0 or corr is None
            or not math.isfinite(corr) or corr < ENTROPY_SCALE_MIN_CORR):
        return None
    factor = mh / ms
    return factor if math.isfinite(factor) and factor >= ENTROPY_SCALE_MIN_FACTOR else None


def entropy_scale_text(ar: Mapping[str, Any], mapping: Mapping[str, str] | None) -> str:
    """The sentence of :func:`entropy_scale_seen` (``ar``: its ``above_range``)."""
    f = ar["mean_entropy"] / ar["mean_surprisal"]
    return (f"{column_named('entropy', mapping)} looks multiplied by about {about(f)}: on "
            f"the {ar['rows']:,} rows above 20 nats the sampled tokens' mean surprisal "
            f"(-infer_logprob) is {ar['mean_surprisal']:.3g} nats for a mean entropy of "
            f"{ar['mean_entropy']:,.4g}, and the two correlate (r = {ar['corr']:.2f}), where "
            "a token's entropy is its expected surprisal (E[-log mu(y)] = H): an entropy "
            "summed over ranks or a batch, or scaled for logging? Divide the column by "
            "that factor in the dump")


def exclusion_hint(excluded: Mapping[str, int], masked: int,
                   mapping: Mapping[str, str] | None = None,
                   where: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """What the reason excluding more than half of the ``masked`` loss-masked tokens
    usually means, as a sentence ('' when no reason does); a reason listed in
    :data:`HINT_MIN_SHARE` from that share on (``positive_logprob``: a probability above 1
    is never a rounding matter, so 1% of the tokens, e.g. one shard of two written as
    probabilities, already says what it means). ``mapping`` (canonical column -> source
    column) names the logprob columns in it; ``where`` (the accounting's
    ``excluded_where``) which of them the reason concerns and which input files hold the
    rows."""
    hinted = _hinted(excluded, masked, mapping, where)
    if hinted is None:
        return ""
    reason, n, text = hinted
    many = "Most are" if n > masked / 2 else f"{n / masked:.1%} are"
    return f"{many} {reason}: {text}."


def exclusion_caveat(excluded: Mapping[str, int], masked: int, valid: int,
                     mapping: Mapping[str, str] | None = None,
                     where: Mapping[str, Mapping[str, Any]] | None = None) -> str | None:
    """A one-line caveat when one exclusion reason removes more than half of the loss-masked
    tokens (the results then rest on what is left, and the reason usually means the columns
    are not what they were taken for), or ``positive_logprob`` 1% of them
    (:data:`HINT_MIN_SHARE`), or when all reasons together remove more than half (then
    naming the largest four with their counts), else None.

    Args:
        excluded: tokens per exclusion reason (the token accounting's ``excluded``).
        masked: loss-masked tokens; valid: those left after the exclusions.
        mapping: canonical column -> source column, to name the columns concerned.
        where: the accounting's ``excluded_where`` (which column, which files).
    """
    hint = exclusion_hint(excluded, masked, mapping, where)
    most = bool(masked) and masked - valid > masked / 2
    if not (hint or most) or not valid:
        return None
    reasons = ""
    if most and (not hint or len(excluded) > 1):  # every reason counts, not the hinted only
        top = sorted(excluded.items(), key=lambda kv: -kv[1])
        reasons = (" (" + ", ".join(f"{r} {n:,}" for r, n in top[:4])
                   + (", ..." if len(top) > 4 else "") + ")")
        if not hint:
            hint = ("No one reason explains most of them: see `entr-diag inspect` for what "
                    "each means and which columns and files it concerns.")
    return (f"caveat: {(masked - valid) / masked:.1%} of the loss-masked tokens are excluded"
            f"{reasons}, the results rest on the {valid:,} others. {hint}")


def exclusion_lead(excluded: Mapping[str, int], masked: int, valid: int,
                   mapping: Mapping[str, str] | None = None,
                   where: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """When more than half of the ``masked`` loss-masked tokens were excluded: a sentence
    saying how many and why (the largest reasons with their counts, and what the dominant
    one usually means, :func:`exclusion_hint`), to lead a refusal of the fit with: the
    exclusions, not the few tokens left, are then what to fix. '' otherwise."""
    if not masked or masked - valid <= masked / 2:
        return ""
    out = masked - valid
    top = sorted(excluded.items(), key=lambda kv: -kv[1])
    reasons = ", ".join(f"{r} {n:,}" for r, n in top[:3]) + (", ..." if len(top) > 3 else "")
    hinted = _hinted(excluded, masked, mapping, where)
    why = f"{hinted[2]}." if hinted else \
        "see `entr-diag inspect` for what each reason means and which columns they concern."
    return (f"{out:,} of the {masked:,} loss-masked tokens ({out / masked:.1%}) were "
            f"excluded ({reasons}): {why}")


def file_units_caveat(flagged: Any, n_files: int,
                      mapping: Mapping[str, str] | None = None) -> str | None:
    """A one-line caveat when some input files (not all) match a unit mistake of their
    own, or hold another token's logprob in one column (:func:`other_token`): ``flagged``,
    ``[(file, UnitsCheck)]`` of :class:`entr_diag.fit.FileUnitsPlan`, ``n_files`` the
    input files; None when empty. Each file's sentence is :func:`units_caveat`'s, after
    the file."""
    if not flagged:
        return None
    parts = []
    for f, check in flagged[:_MAX_FILES_NAMED]:
        text = units_caveat(check.to_dict(), mapping) or ""
        parts.append(f"in {f} ({check.tokens:,} tokens), "
                     + text.removeprefix("caveat: ").replace(" (unless the engine", " (unless "
                                                             "its engine"))
    more = (f" ({len(flagged) - _MAX_FILES_NAMED:,} more file(s) like this)"
            if len(flagged) > _MAX_FILES_NAMED else "")
    verb = "looks" if len(flagged) == 1 else "look"
    kinds = list(dict.fromkeys("unit" if c.likely_mistake else "token" if c.other_token
                               else "scale" if c.entropy_scale else "entropy"
                               for _f, c in flagged))
    what = {"unit": "written in another unit than the others",
            "token": "to hold another token's logprob, unlike the others",
            "scale": "to hold an entropy scaled by a constant, unlike the others",
            "entropy": "to hold an entropy of another distribution than the one that "
                       "sampled, unlike the others"}[kinds[0]] if len(kinds) == 1 else (
        "unlike the others (" + ", or ".join(
            {"unit": "another unit", "token": "another token's logprob",
             "scale": "an entropy scaled by a constant",
             "entropy": "an entropy of another distribution"}[k] for k in kinds) + ")")
    return (f"caveat: {len(flagged):,} of the {n_files:,} input files {verb} {what}: "
            + " ".join(parts) + more)


def file_scale_caveat(outliers: Any, n_files: int) -> str | None:
    """A one-line caveat when some input files show a mismatch many times the other files'
    at the same entropy (``outliers``: :meth:`entr_diag.fit.FileUnitsPlan.scale_outliers`),
    naming them; None when none does."""
    if not outliers:
        return None
    listed = "; ".join(f"{o['file']} ({o['tokens']:,} tokens): {o['ratio']:,.3g} times"
                       for o in outliers[:_MAX_FILES_NAMED])
    more = (f" ({len(outliers) - _MAX_FILES_NAMED:,} more file(s) like this)"
            if len(outliers) > _MAX_FILES_NAMED else "")
    verb = "shows" if len(outliers) == 1 else "show"
    return (f"caveat: {len(outliers):,} of the {n_files:,} input files {verb} a mismatch far "
            f"larger than the other files' at the same entropy (mean delta^2, the median over "
            f"the entropy bins): {listed}{more}. A writer, node or engine set up otherwise "
            "(a sampling temperature or top-k / top-p its logprobs leave out, another model, "
            "precision or kernel), or policies more versions behind (see the staleness "
            "strata)? The pooled law mixes its tokens in: analyse those files "
            "on their own, and the others without them.")


#: significant bits of the binary storage formats :func:`storage_caveat` names
_FORMAT_BITS = {"bf16": 8, "fp16": 11}


def storage_caveat(storage: Mapping[str, Any] | None,
                   mapping: Mapping[str, str] | None = None) -> str | None:
    """A one-line caveat when logprob columns are stored in bf16 or fp16 and the rounding
    to that grid makes up STORAGE_SHARE_MIN or more of mean delta^2 in some entropy decile
    (``storage``: :func:`entr_diag.forensics.storage_precision`, ``distorts`` True), naming
    the columns, their format and the deciles where the rounding's share is largest; else
    None."""
    if not storage or not storage.get("distorts"):
        return None
    from entr_diag.forensics import STORAGE_SHARE_MIN

    cols = storage.get("columns") or {}
    fmts = sorted(set(cols.values()))
    if len(fmts) == 1:
        names = " and ".join(column_named(c, mapping) for c in cols)
        what = f"{names} {'are' if len(cols) > 1 else 'is'} stored in {fmts[0]}"
    else:
        what = " and ".join(f"{column_named(c, mapping)} in {f}" for c, f in cols.items())
        what = f"the logprobs are stored rounded ({what})"
    bits = ", ".join((f"{f}: " if len(fmts) > 1 else "")
                     + f"{_FORMAT_BITS[f]} significant bits, a spacing of "
                     f"2^-{_FORMAT_BITS[f]} to 2^-{_FORMAT_BITS[f] - 1} of |logprob|"
                     for f in fmts if f in _FORMAT_BITS)

    def pct(x: float) -> str:
        return "nearly all" if x >= 0.95 else f"{x:.0%}"

    big = [b for b in storage.get("by_entropy") or () if b["share"] >= STORAGE_SHARE_MIN]
    if big:
        big = sorted(sorted(big, key=lambda b: -b["share"])[:2], key=lambda b: b["h_lo"])
        where = " and ".join(
            f"{pct(b['share'])}{' of mean delta^2' if i == 0 else ''} at H "
            f"{b['h_lo']:.2g}-{b['h_hi']:.2g}" for i, b in enumerate(big)) + (
            " (entropy deciles; JSON storage_precision)")
    else:
        where = (f"{pct(float(storage.get('share_pooled') or 0.0))} of mean delta^2 (JSON "
                 "storage_precision)")
    return (f"caveat: {what} ({bits}): the rounding alone makes up an estimated {where}: "
            "k, alpha and any low-entropy excess read high where it is large. Dump the "
            "logprobs as float32 (a log-softmax computed and stored in float32) to measure "
            "the mismatch alone.")


def rounding_caveat(rounded: Mapping[str, Any] | None,
                    mapping: Mapping[str, str] | None = None,
                    zero_placeholder: int = 0, nucleus_zeros: int = 0) -> str | None:
    """A one-line caveat when logprob columns hold values rounded to a decimal step
    (``rounded``: :func:`entr_diag.forensics.rounded_logprobs`, column -> step in nats; or
    ``{"by_file": {file: {column: step}}, "input_files": n}`` when some input files only
    are), else None:
    every log-ratio below the step is lost, the low-entropy regime with it.
    ``zero_placeholder``: the rows the accounting excluded as zero_placeholder (a logprob
    rounded to 0.0 next to one that is not reads as a placeholder): named when some;
    ``nucleus_zeros``: the engine zeros the loader kept as one-token nuclei of truncated
    sampling (:attr:`~entr_diag.io.load.Dataset.nucleus_zeros`), in a rounded engine
    column probably logprobs rounded to 0: named when some."""
    if not rounded:
        return None

    def cols(r: Mapping[str, float]) -> str:
        return ", ".join(f"{column_named(c, mapping)} to {step:g} nats"
                         for c, step in r.items())

    by_file = rounded.get("by_file")
    if by_file:  # some input files only: {file: {column: step}}
        listed = list(by_file.items())
        where = "; ".join(f"in {f}: {cols(r)}" for f, r in listed[:_MAX_FILES_NAMED])
        more = (f"; {len(listed) - _MAX_FILES_NAMED:,} more file(s) like this"
                if len(listed) > _MAX_FILES_NAMED else "")
        n = int(rounded.get("input_files") or 0)
        of = f" of the {n:,}" if n else ""
        head = f"the logprobs of {len(listed):,}{of} input files are stored rounded ({where}{more})"
    else:
        head = f"the logprobs are stored rounded ({cols(rounded)})"
    parts = []
    if zero_placeholder:
        parts.append(f"{zero_placeholder:,} row(s) excluded as zero_placeholder, 0.0 on one "
                     "side or both")
    if nucleus_zeros:
        parts.append(f"{nucleus_zeros:,} engine zero(s) kept as valid tokens, which would "
                     "otherwise read as one-token nuclei of top-p / top-k sampling")
    zeros = (f" ({' and '.join(parts)}, are probably such logprobs rounded to 0)"
             if parts else "")
    return (f"caveat: {head}: log-ratios below that step are lost (they read as 0 or the "
            f"step), and the low-entropy regime with them{zeros}; re-dump them at full "
            "precision.")


def zero_prefix_caveat(zp: Mapping[str, Any] | None,
                       mapping: Mapping[str, str] | None = None) -> str | None:
    """A one-line caveat when sequences begin with tokens whose logprobs and entropy are
    all exactly 0.0 (``zp``: :func:`entr_diag.forensics.zero_prefixes`, on the shift
    test's sampled sequences), else None: a loss mask covering the prompt or padding
    written as zeros."""
    if not zp:
        return None
    cols = ", ".join(column_named(c, mapping) for c in zp["columns"])
    where = files_listed(zp.get("files") or {}, int(zp.get("input_files") or 1))
    n, of = int(zp["sequences"]), int(zp["sequences_sampled"])
    whole = int(zp.get("whole_sequences") or 0)
    tok = int(zp["tokens"]) / max(int(zp["tokens_sampled"]), 1)
    files = zp.get("files") or {}
    if where and len(files) == 1:  # "in X (1 of the N input files): n of its m sampled ..."
        f = next(iter(files))
        head = (f"in {f} (1 of the {int(zp.get('input_files') or 1):,} input files), {n:,} "
                f"of its {of:,} sampled sequences ({n / max(of, 1):.0%})")
    elif where:
        head = (f"in {len(files):,} of the {int(zp.get('input_files') or 1):,} input files "
                f"({', '.join(f'{k} ({v:,})' for k, v in list(files.items())[:3])}"
                f"{' and more' if len(files) > 3 else ''}), {n:,} of their {of:,} sampled "
                f"sequences ({n / max(of, 1):.0%})")
    else:
        head = f"{n:,} of {of:,} sampled sequences ({n / max(of, 1):.0%})"
    return (f"caveat: {head}"
            + f" begin with tokens whose {cols} are all exactly 0.0 (median "
            f"{zp['median_length']:g} tokens, {tok:.1%} of their tokens"
            + (f"; {whole:,} are zeros throughout" if whole else "")
            + "): the loss mask probably covers the prompt or padding written as zeros; those "
            "tokens enter the fit at H = 0 with delta = 0 and hide the low-entropy regime. "
            "Check which column is the loss mask (--column loss_mask=NAME) or drop those "
            "rows.")


def _entropy_shift_head(ea: Mapping[str, Any], mapping: Mapping[str, str] | None) -> str:
    """The shift's statement with its numbers (:func:`entropy_shift_caveat`)."""
    lag = int(ea["best_lag"])
    ent = column_named("entropy", mapping)
    k = abs(lag)
    holds = f"t{-lag:+d}"  # entropy[t] holds the entropy of token t - lag
    files = ea.get("files") or {}
    where = ""
    if ea.get("steps"):
        where = f" in steps {step_ranges(ea['steps'])}"
    if files:
        where = (f" in {len(files):,} of the {int(ea.get('input_files') or 1):,} input files "
                 f"({', '.join(list(files)[:3])}{' and more' if len(files) > 3 else ''})")
    rc, gap = ea["rank_corr"], ea["gap_vs_lag0"]
    halves = ea.get("gap_halves") or []
    return (f"the {ent} column looks shifted by {k} token{'s' if k > 1 else ''} against the "
            f"logprobs{where}: entropy[t] holds the entropy of token {holds} (the surprisal "
            f"-infer_logprob[t] "
            f"ranks with entropy[t{lag:+d}] at rank correlation {rc[str(lag)]:.3f}, "
            f"{gap[str(lag)]:.2f} above lag 0's on the same tokens"
            + (f", {min(halves):.2f} or more in each half of the sample" if halves else "")
            + f"; {int(ea['pairs'][str(lag)]):,} token pairs of "
            f"{int(ea['sequences']):,} sampled sequences)")


def entropy_shift_caveat(ea: Mapping[str, Any] | None,
                         mapping: Mapping[str, str] | None = None) -> str | None:
    """A one-line caveat when the entropy column is shifted against the logprob columns
    (``ea``: :meth:`entr_diag.forensics.EntropyAlignment.to_dict`, status ``shifted``),
    else None: the law, the breakpoint and the entropy-keyed gates read each token's
    delta against a neighbour's entropy."""
    if ea and ea.get("status") == "surprisal":
        src = str(ea.get("surprisal_column") or "infer_logprob")
        return (f"caveat: the {column_named('entropy', mapping)} column equals the sampled "
                f"token's surprisal -{column_named(src, mapping)} on "
                f"{float(ea.get('surprisal_share') or 0):.0%} of the sampled tokens: it holds "
                "-logprob of the sampled token, not the entropy of the distribution the token "
                "was sampled from, so the fitted law, its breakpoint, the noise regime and the "
                "entropy-keyed gates regress delta^2 on the logprobs themselves and mean "
                "nothing; the log-ratio metrics (KL, chi2, ESS) do not read the entropy and "
                "stand. Dump H = -sum_v p(v) log p(v) over the vocabulary at each position "
                "(verl's entropys, or the engine's), or map it with --column entropy=NAME.")
    if ea and ea.get("status") == "unrelated":
        rc = (ea.get("rank_corr") or {}).get("0")
        return (f"caveat: the {column_named('entropy', mapping)} column does not follow the "
                "tokens: the sampled tokens' surprisal does not rank with it at any lag "
                + (f"(rank correlation {float(rc):.3f} at lag 0, " if rc is not None else "(")
                + "where a token's own entropy gives 0.4 to 0.99), as with one value per "
                "sequence repeated on its tokens (a mean?) or rows taken from other tokens, so "
                "the fitted law, its breakpoint, the noise regime and the entropy-keyed gates "
                "mean nothing; the log-ratio metrics (KL, chi2, ESS) do not read the entropy "
                "and stand. Dump the entropy of the distribution each token was sampled from, "
                "per token, or map it with --column entropy=NAME.")
    if not ea or ea.get("status") != "shifted" or ea.get("best_lag") is None:
        return None
    return (f"caveat: {_entropy_shift_head(ea, mapping)}: the fitted law, its breakpoint, "
            "the noise regime and the entropy-keyed gates pair each token's log-ratio with "
            "another token's entropy and mean nothing; the log-ratio metrics (KL, chi2, "
            "ESS) do not read the entropy and stand. Check how the entropy array is sliced "
            "against the logprobs (entropys[:, 1:] vs [:, :-1], the logits[:-1] / labels[1:] "
            "shift, a prompt/BOS offset) and re-dump entropy[t] from the distribution token t "
            "was sampled from.")


def integer_columns(notes: list[str] | tuple[str, ...]) -> list[str]:
    """The integer-typed logprob or entropy columns the loader read, as its ``warning:
    CANON ('SRC') holds integers ...`` notes name them (``CANON ('SRC')``)."""
    return [n.removeprefix("warning: ").split(" holds integers")[0] for n in notes
            if n.startswith("warning: ") and " holds integers " in n]


def integer_caveat(notes: list[str] | tuple[str, ...]) -> str | None:
    """A one-line caveat when the loader read an integer-typed logprob or entropy column
    (its ``warning: CANON ('SRC') holds integers ...`` note), else None: a verdict on
    rounded or scaled log-probabilities means nothing, whatever its intervals say."""
    cols = integer_columns(notes)
    if not cols:
        return None
    return (f"caveat: {' and '.join(cols)} {'holds' if len(cols) == 1 else 'hold'} integers "
            "(rounded or scaled values, not log-probabilities in nats): the verdict is "
            "meaningless until the dump stores them as floats.")


#: mean(-infer_logprob) / mean(H) is ~1 over tokens sampled from the engine's distribution
#: (E[-log mu(y)] = H(mu), :class:`entr_diag.fit.UnitsCheck`), and sum(train_logprob) /
#: sum(infer_logprob) is ~1 when both sides share a unit; a unit mistake scales one or both
#: by a known factor. key -> (the wrong columns, their unit, the conversion to nats, the
#: factor expected of surprisal / entropy (NaN: not read), the factor of train / infer)
UNIT_SIGNATURES: dict[str, tuple[tuple[str, ...], str, str, float, float]] = {
    "entropy_bits": (("entropy",), "bits (log base 2)", "ln 2", math.log(2), 1.0),
    "entropy_log10": (("entropy",), "log10 units", "ln 10", math.log(10), 1.0),
    "logprob_log10": (("train_logprob", "infer_logprob"), "log10 values", "ln 10",
                      1 / math.log(10), 1.0),
    "logprob_log2": (("train_logprob", "infer_logprob"), "log2 values", "ln 2",
                     1 / math.log(2), 1.0),
    "infer_logprob_log10": (("infer_logprob",), "log10 values", "ln 10", 1 / math.log(10),
                            math.log(10)),
    "infer_logprob_log2": (("infer_logprob",), "log2 values", "ln 2", 1 / math.log(2),
                           math.log(2)),
    # the trainer's column alone: the inference side (and the surprisal ratio) is in nats
    "train_logprob_log10": (("train_logprob",), "log10 values", "ln 10", math.nan,
                            1 / math.log(10)),
    "train_logprob_log2": (("train_logprob",), "log2 values", "ln 2", math.nan,
                           1 / math.log(2)),
}
#: a ratio within this relative distance of a signature's factor matches it (the windows
#: all exclude [0.75, 1.34] for the surprisal ratio: temperature or top-p sampling moves it
#: from 1, but a unit mistake by a whole factor)
UNIT_TOLERANCE = 0.07
#: a unit mistake scales every entropy bin's ratio alike: the entropy-weighted first and
#: ninth deciles of the bins' ratios lie within this factor of each other (1.02 to 1.07 on
#: real bf16 / fp16 runs and synthetic ones with a noise regime, in bits or log2 too),
#: while a temperature the logs leave out, an entropy from the top-k logprobs or a
#: low-entropy noise regime bends the ratio with the entropy (0.13 to 0.92 across the bins
#: at temperature 0.7)
UNIT_MAX_SPREAD = 1.25
#: fewer tokens than this and no signature is matched (on the bundled run, 500 tokens of 5
#: sequences give ratios from 0.90 to 1.11)
MIN_UNIT_TOKENS = 200


def unit_mistake(ratio: float, tokens: int, spread: float = 1.0,
                 train_over_infer: float = 1.0, train_ratio: float = math.nan) -> str | None:
    """The key of :data:`UNIT_SIGNATURES` that the units check matches, else None.

    Args:
        ratio: the entropy-weighted median of the bins' mean(-infer_logprob) / mean(H)
            (``UnitsCheck.ratio_binned``).
        tokens: the tokens both sums run over; below :data:`MIN_UNIT_TOKENS`, None.
        spread: the bins' ratio spread (``UnitsCheck.ratio_spread``: entropy-weighted ninth
            over first decile); above :data:`UNIT_MAX_SPREAD` the ratio is not a constant
            factor and no signature that reads it matches.
        train_over_infer: sum(train_logprob) / sum(infer_logprob) over the same tokens.
        train_ratio: ``ratio`` of -train_logprob (``UnitsCheck.train_ratio_binned``; NaN:
            not known).

    A signature matches when each factor it reads lies within :data:`UNIT_TOLERANCE` of
    the value (``|value / factor - 1| <= 0.07``): ``logprob_log10`` needs ``ratio`` near
    1/ln 10 and ``train_over_infer`` near 1 (both sides in log10); ``infer_logprob_log10``
    ``ratio`` near 1/ln 10 and ``train_over_infer`` near ln 10 (the engine's side alone);
    ``train_logprob_log10`` ``train_over_infer`` near 1/ln 10 with the engine's side in
    nats: its ``ratio`` within :data:`SAMPLED_RATIO_WINDOW` and, when ``train_ratio`` is
    known, ``train_ratio / ratio`` near 1/ln 10 too (the factor holding bin by bin). An
    engine sampling from a top-k support it renormalises gives a ``train_over_infer`` of
    1.4 to 1.5 at k = 15 to 20, near 1/ln 2, but its ``ratio`` is far below 1 (0.51 at
    k = 20: the engine's logprobs are of the truncated distribution) and the factor does
    not hold per bin (1.60).
    """
    def near(x: float, factor: float) -> bool:
        return x > 0 and math.isfinite(x) and abs(x / factor - 1) <= UNIT_TOLERANCE

    if tokens < MIN_UNIT_TOKENS:
        return None
    flat = math.isfinite(spread) and spread <= UNIT_MAX_SPREAD
    lo, hi = SAMPLED_RATIO_WINDOW
    for key, (*_cols, f_ratio, f_train) in UNIT_SIGNATURES.items():
        if not near(train_over_infer, f_train):
            continue
        if math.isnan(f_ratio):  # the trainer's column alone: the engine's reads in nats
            if lo <= ratio <= hi and (math.isnan(train_ratio)
                                      or near(train_ratio / ratio, f_train)):
                return key
        elif flat and near(ratio, f_ratio):
            return key
    return None


#: a logprob column's binned surprisal / entropy within this window reads as the sampled
#: token's (the unit-free window of UNIT_TOLERANCE: temperature or top-p moves it, not out)
SAMPLED_RATIO_WINDOW = (0.75, 1.34)
#: the two columns' mean surprisals differing by more than this factor (and no unit
#: signature matching) is no mismatch between engines: one column holds another token's
#: logprob. Real runs agree to a few percent; a temperature applied on one side moves the
#: factor by 3 to 6 % (toy softmaxes at T = 0.7), staleness by less
OTHER_TOKEN_FACTOR = 1.3
#: ... and the two columns correlate less than this within the entropy bins: logprobs of
#: one token under two engines, even with a temperature and top-k 5 on one side only,
#: correlate at 0.6 to 1 (toy softmaxes); another token's at -0.1 (token_id + 1) to 0.3
#: (the argmax token's)
OTHER_TOKEN_MAX_CORR = 0.5


#: the entropy column's unit, by the key of :data:`UNIT_SIGNATURES` that names it: (its
#: name, the factor that turns it into nats)
ENTROPY_UNITS: dict[str, tuple[str, float]] = {
    "entropy_bits": ("bits", math.log(2)),
    "entropy_log10": ("log10 units", math.log(10)),
}


def entropy_unit(units: Mapping | None) -> tuple[str, float] | None:
    """(unit, factor to nats) when the fit's units check (a fit result's
    ``to_dict()["units"]``, or None) names the entropy column's unit as another than nats
    (``likely_mistake`` ``entropy_bits``: ``("bits", ln 2)``; ``entropy_log10``:
    ``("log10 units", ln 10)``) or reads it as scaled by a constant c (``entropy_scale``:
    ``("nats x c", 1 / c)``; helper-49: a column x2 had its H* labelled nats), else None.
    Every entropy the tool prints (bin edges, H*) is then in that unit, as the column
    reads, not in nats."""
    if not isinstance(units, Mapping):
        return None
    key = units.get("likely_mistake")
    if isinstance(key, str) and key in ENTROPY_UNITS:
        return ENTROPY_UNITS[key]
    c = units.get("entropy_scale")
    if isinstance(c, (int, float)) and math.isfinite(c) and c > 0:
        return (f"nats x {about(c)}" if c > 1 else f"nats / {about(1 / c)}", 1 / c)
    return None


def entropy_text(value: str, interval: str, units: Mapping | None,
                 nats: str | None = None) -> str:
    """An entropy printed with its unit and interval: ``"<value> nats <interval>"``, or,
    when the units check names the entropy column's unit (:func:`entropy_unit`),
    ``"<value> <interval> in the entropy column's unit (probably bits; <nats> nats)"``.
    ``value``, ``interval``: the entropy and its interval (e.g. ``"[0.029, 0.041]"``) as
    the column reads, formatted; ``nats``: the same converted to nats, formatted (left out
    when None)."""
    unit = entropy_unit(units)
    if unit is None:
        return f"{value} nats {interval}".rstrip()
    conv = f"; {nats} nats" if nats else ""
    return f"{value} {interval}".rstrip() + f" in the entropy column's unit (probably {unit[0]}{conv})"

def other_token(ratio: float, ratio_binned: float, train_ratio_binned: float, tokens: int,
                train_over_infer: float, within_bin_corr: float = math.nan) -> str | None:
    """The logprob column that does not hold the SAMPLED token's logprob, else None.

    For a token y sampled from the engine's distribution, E[-log mu(y)] = H: a column
    holding the sampled token's logprob has a mean surprisal near the mean entropy. A
    column gathered at another token (the wrong index, a tokenizer or vocabulary offset,
    the argmax token's) is not, and the two columns' mean surprisals differ by more than
    :data:`OTHER_TOKEN_FACTOR`, which no engine mismatch, staleness or one-sided
    temperature does.

    Args:
        ratio: ``UnitsCheck.ratio``: mean(-infer_logprob) / mean(H).
        ratio_binned, train_ratio_binned: the entropy-weighted median over the bins of
            -infer_logprob / H and of -train_logprob / H (``UnitsCheck``).
        tokens: the tokens the sums run over; below :data:`MIN_UNIT_TOKENS`, None.
        train_over_infer: sum(train_logprob) / sum(infer_logprob).
        within_bin_corr: the two columns' pooled correlation within the entropy bins
            (``UnitsCheck.within_bin_corr``): logprobs of one token correlate even when one
            side samples with a temperature or top-k the other leaves out, which also
            moves the mean surprisal by more than the factor.

    Returns the column whose mean surprisal is farther from the mean entropy (in log
    ratio) when the two columns differ by more than the factor, correlate less than
    :data:`OTHER_TOKEN_MAX_CORR` within the bins, and the OTHER column's binned ratio
    lies in :data:`SAMPLED_RATIO_WINDOW` (it reads as the sampled token's); None
    otherwise (also without a correlation). The caller asks only when no unit signature
    matched.
    """
    lo, hi = SAMPLED_RATIO_WINDOW
    vals = (ratio, ratio_binned, train_ratio_binned, train_over_infer)
    if tokens < MIN_UNIT_TOKENS or not all(math.isfinite(v) for v in vals):
        return None
    if not (math.isfinite(within_bin_corr) and within_bin_corr < OTHER_TOKEN_MAX_CORR):
        return None
    s_inf, s_train = ratio, ratio * train_over_infer  # each column's mean surprisal / H
    if s_inf > 0 and s_train > 0:
        if 1 / OTHER_TOKEN_FACTOR <= train_over_infer <= OTHER_TOKEN_FACTOR:
            return None
        infer_off = abs(math.log(s_inf)) > abs(math.log(s_train))
    elif s_inf > 0 or s_train > 0:
        # a mean surprisal of 0 or less (logprobs averaging at or above 0: a constant such
        # as +1e-5, a filler) is no sampled token's: E[-log mu(y)] = H > 0
        infer_off = s_train > 0
    else:
        return None
    good = train_ratio_binned if infer_off else ratio_binned
    if not lo <= good <= hi:
        return None
    return "infer_logprob" if infer_off else "train_logprob"


#: the sampled tokens' binned surprisal / entropy of consistent logs lies within this factor
#: of 1 (:func:`entropy_mismatch`)
ENTROPY_MISMATCH_FACTOR = 1.18
#: ... read over at least this many tokens (a few hundred scatter it by 10%)
ENTROPY_MISMATCH_MIN_TOKENS = 20_000


def entropy_mismatch(ratio_binned: float, tokens: int) -> bool:
    """Whether the sampled tokens' surprisal and their entropy disagree beyond what the
    logs of one sampling distribution allow: over at least ENTROPY_MISMATCH_MIN_TOKENS
    tokens, the entropy-weighted median of the bins' mean(-infer_logprob) / mean(H) more
    than ENTROPY_MISMATCH_FACTOR from 1 either way (for a token drawn from mu,
    E[-log mu(y) | H] = H(mu): 0.99 to 1.01 on the bundled run, on synthetic runs and on
    tiny real models in bf16, fp16 or fp8, stale or not, with temperature, top-p or top-k
    logged as sampled). Read when no unit mistake and no other token's column explains the
    ratio (:func:`unit_mistake`, :func:`other_token`): on a tiny real model, an entropy
    over the top-20 logprobs only read 1.63, a temperature of 0.7 left out of the logged
    logprobs and entropy 0.57; on toy softmaxes of 128 tokens, T = 0.5 left out reads
    0.85 (random logits flatten less under a temperature than a trained model's)."""
    return (tokens >= ENTROPY_MISMATCH_MIN_TOKENS and math.isfinite(ratio_binned)
            and ratio_binned > 0
            and abs(math.log(ratio_binned)) > math.log(ENTROPY_MISMATCH_FACTOR))


def entropy_mismatch_caveat(units: Mapping, mapping: Mapping[str, str] | None = None) -> str:
    """The caveat of :func:`entropy_mismatch` (``units``: a UnitsCheck's ``to_dict()``):
    the ratio, which way it points and what usually makes it."""
    r = units["ratio_binned"]
    ent, inf = column_named("entropy", mapping), column_named("infer_logprob", mapping)
    trainer = (" (a trainer-side entropy, as here, is of the policy being trained: one far "
               "from the sampling one, many versions apart, reads so too)"
               if (mapping or {}).get("entropy") and (mapping or {}).get("entropy") == (
                   mapping or {}).get("train_entropy") else "")
    if r < 1:
        why = ("the sampled tokens are less surprising than the entropy says. Either "
               f"{inf} is not the logprob of the sampling distribution (a temperature below "
               "1, top-p or top-k the logged logprobs leave out, e.g. an engine's raw "
               "logprobs: delta is then not its log importance ratio), or "
               f"{ent} is of another, flatter distribution (computed before the temperature, "
               f"or over the whole vocabulary where the sampler truncated it){trainer}; "
               + ("the two logprob columns agree (train_logprob / infer_logprob = "
                  f"{units['train_over_infer']:.3f}), which the entropy's being the odd one "
                  "out explains as well" if abs(units.get("train_over_infer", math.nan) - 1)
                  <= 0.01 else "the sampler's settings tell which"))
    else:
        why = ("the sampled tokens are more surprising than the entropy says: the entropy "
               "was computed over a truncated list (e.g. the top-k logprobs the engine "
               f"returned) or of a sharper distribution than the one that sampled{trainer}, "
               f"so {ent} understates H and the law's entropy axis is off")
    return (
        f"caveat: {ent} and {inf} do not describe one sampling distribution: the sampled "
        f"tokens' surprisal (-infer_logprob) averages {r:.3g} times their entropy (the "
        "entropy-weighted median over the entropy bins), where a token drawn from a "
        "distribution has its entropy as mean surprisal (E[-log mu(y)] = H(mu), 0.99 to 1.01 "
        f"on consistent logs); {why}. Check how the engine computes the entropy and which "
        "logprobs it returns (before or after temperature and truncation)."
        + _unit_alike(units, mapping)
    )


def _unit_alike(units: Mapping, mapping: Mapping[str, str] | None) -> str:
    """A sentence for the entropy-mismatch caveat when its ratio is also a unit mistake's
    factor, alike in the entropy bins (``ratio_spread`` within :data:`UNIT_MAX_SPREAD`),
    that :func:`unit_mistake` did not name because ``train_over_infer`` is off that
    signature's value (e.g. entropy in bits on a top-p run: 0.694 with the two columns 1.07
    apart); else ''."""
    r, spread = units.get("ratio_binned", math.nan), units.get("ratio_spread", math.nan)
    t = units.get("train_over_infer", math.nan)
    if not (math.isfinite(spread) and spread <= UNIT_MAX_SPREAD and r > 0):
        return ""
    near = [(abs(t / f_train - 1) if t > 0 else math.inf, key)
            for key, (_c, _u, _n, f_ratio, f_train) in UNIT_SIGNATURES.items()
            if math.isfinite(f_ratio) and abs(r / f_ratio - 1) <= UNIT_TOLERANCE]
    if not near:
        return ""
    key = min(near)[1]
    canon, unit, to_nats, f_ratio, f_train = UNIT_SIGNATURES[key]
    cols = " and ".join(column_named(c, mapping) for c in canon)
    return (f" Its {r:.3g} is also near {'1/' if 'logprob' in key else ''}{to_nats} = "
            f"{f_ratio:.3f}, alike in the entropy bins (those holding 80% of the entropy "
            f"{_alike(spread)}), as {cols} in {unit} would read: "
            f"not named so because train_logprob averages {t:.3g} times infer_logprob, "
            f"not {f_train:.3g} (the two logprob columns differ, as truncated sampling or "
            f"staleness make them); rule that unit out first.")


#: the two logprob columns share a unit when train_logprob / infer_logprob is within this
#: of 1 (:func:`entropy_scaled`; real runs: 1.00 to 1.01, stale or tempered ones 1.03 to
#: 1.06, a top-k engine renormalising its support 1.4 to 1.5)
SCALE_MAX_TRAIN_OFF = 0.1


def entropy_scaled(ratio_binned: float, tokens: int, spread: float,
                   train_over_infer: float) -> float | None:
    """The factor c of an entropy column holding c x H (any c other than a unit's ln 2 or
    ln 10, which :func:`unit_mistake` names first), else None: over MIN_UNIT_TOKENS tokens
    or more, the bins' surprisal / entropy ratio (``ratio_binned``, the entropy-weighted
    median) at least ENTROPY_SCALE_MIN_FACTOR from 1 either way and alike in the bins
    (``spread`` within UNIT_MAX_SPREAD, as a unit mistake's), with the two logprob columns
    in one unit (``train_over_infer`` within SCALE_MAX_TRAIN_OFF of 1: the entropy is the
    odd one out). c = 1 / ``ratio_binned``: E[-log mu(y) | H] = H for a token drawn from mu
    (METHOD.md). A temperature, top-k or top-p the logged values leave out bends the ratio
    with the entropy (0.13 to 0.92 across the bins at T = 0.7; real tiny-model runs with
    T = 0.7 raw, top-p 0.9 and top-k 20: spreads 2.6, 2.8 and 1.18 at ratios 0.73, 0.8 and
    0.94): :func:`entropy_mismatch` reads those."""
    if (tokens < MIN_UNIT_TOKENS or not (math.isfinite(ratio_binned) and ratio_binned > 0)
            or not (math.isfinite(spread) and spread <= UNIT_MAX_SPREAD)
            or not (math.isfinite(train_over_infer)
                    and abs(train_over_infer - 1) <= SCALE_MAX_TRAIN_OFF)
            or abs(math.log(ratio_binned)) < math.log(ENTROPY_SCALE_MIN_FACTOR)):
        return None
    return 1 / ratio_binned


def about(factor: float) -> str:
    """A scale factor to three significant digits, as a person writes it: ``"1,000"``,
    ``"9.99"``, ``"0.1"``."""
    return f"{float(f'{factor:.3g}'):,g}"


def entropy_scale_caveat(units: Mapping, mapping: Mapping[str, str] | None = None) -> str:
    """The caveat of :func:`entropy_scaled` (``units``: a UnitsCheck's ``to_dict()`` with
    ``entropy_scale`` set)."""
    c, r = units["entropy_scale"], units["ratio_binned"]
    ent = column_named("entropy", mapping)
    spread = units.get("ratio_spread", math.nan)
    how = (f"multiplied by about {about(c)}" if c > 1 else f"divided by about {about(1 / c)}")
    return (
        f"caveat: {ent} looks {how}: the sampled tokens' surprisal (-infer_logprob) "
        f"averages {r:.3g} times their entropy alike in the entropy bins (those holding 80% "
        f"of the entropy {_alike(spread)}), where it is 1 for tokens drawn from the "
        "distribution whose entropy is logged (E[-log mu(y)] = H(mu)), and the two logprob "
        f"columns agree (train_logprob / infer_logprob = {units['train_over_infer']:.3f}): "
        "an entropy summed over ranks or a batch, or scaled for logging? The law's k, H*, "
        "the noise regime's boundary, the 20-nat range check and the ENTR gate's budget are "
        "then off by that factor (alpha is not): "
        + (f"divide the column by {about(c)}" if c > 1 else f"multiply the column by {about(1 / c)}")
        + " in the dump."
    )


def unrelated_columns(within_bin_corr: float, tokens: int, ratio: float = 1.0,
                      train_over_infer: float = 1.0) -> bool:
    """Whether the two logprob columns hold the logprobs of different tokens although
    neither reads as another token's (:func:`other_token` names none: their mean
    surprisals agree): they correlate less than :data:`OTHER_TOKEN_MAX_CORR` within the
    entropy bins, over :data:`MIN_UNIT_TOKENS` tokens or more. One token's logprobs under
    two engines correlate at 0.98 or more on real runs (bf16 or fp16 engines, stale,
    tempered, top-k or top-p on one side) and at 0.6 or more on toy softmaxes with a
    temperature and top-k 5 on one side; the trainer's logprobs joined from another
    sequence of the step at 0.002. ``ratio`` and ``train_over_infer`` (``UnitsCheck``):
    both columns must have a positive mean surprisal (a column of zeros is no sampled
    token's logprob: the exclusions or the other-token check speak of it)."""
    return (tokens >= MIN_UNIT_TOKENS and math.isfinite(within_bin_corr)
            and within_bin_corr < OTHER_TOKEN_MAX_CORR
            and math.isfinite(ratio) and ratio > 0
            and math.isfinite(train_over_infer) and train_over_infer > 0)


def unrelated_caveat(units: Mapping, mapping: Mapping[str, str] | None = None) -> str:
    """The caveat of :func:`unrelated_columns` (``units``: a UnitsCheck's ``to_dict()``)."""
    s_inf = units["mean_surprisal"]
    s_train = s_inf * units["train_over_infer"]
    return (
        f"caveat: {column_named('train_logprob', mapping)} and "
        f"{column_named('infer_logprob', mapping)} barely correlate within the entropy bins "
        f"(r = {units.get('within_bin_corr', math.nan):.2f}; one token's logprobs under two "
        "engines correlate at 0.6 or more, even with a temperature or top-k on one side), "
        f"though each reads as a sampled token's (mean surprisal {s_train:.3g} and "
        f"{s_inf:.3g} nats for a mean entropy of {units['mean_entropy']:.3g}): they do not "
        "hold the logprobs of the same tokens. Rows of the trainer's and the engine's dumps "
        "matched on the wrong key (seq_id, position, step) or misordered within a batch? "
        "Every log-ratio, the law and the gates are then meaningless: check how the two "
        "sides' logprobs are joined to the tokens."
    )


def other_token_caveat(units: Mapping, mapping: Mapping[str, str] | None = None) -> str:
    """The caveat of :func:`other_token` (``units``: a UnitsCheck's ``to_dict()`` with
    ``other_token`` set): the two columns' mean surprisals against the mean entropy."""
    col = units["other_token"]
    good = "train_logprob" if col == "infer_logprob" else "infer_logprob"
    s_inf = units["mean_surprisal"]
    s = {"infer_logprob": s_inf, "train_logprob": s_inf * units["train_over_infer"]}
    factor = s[col] / s[good]
    differ = (f"the two differ by a factor of {max(factor, 1 / factor):.3g}, which no unit, "
              "engine mismatch or staleness explains" if factor > 0 else
              "no sampled token's logprob averages 0 or more (a constant or a filler column?)")
    return (
        f"caveat: {column_named(col, mapping)} does not look like the logprob of the sampled "
        f"token: its mean surprisal is {s[col]:.3g} nats, {column_named(good, mapping)}'s "
        f"{s[good]:.3g} nats, for a mean entropy of {units['mean_entropy']:.3g} nats (the "
        "token sampled has a mean surprisal equal to the mean entropy: E[-log mu(y)] = "
        f"H(mu)); {differ}, and they barely correlate within "
        f"the entropy bins (r = {units.get('within_bin_corr', math.nan):.2f}; the same "
        "token's logprobs under two engines correlate at 0.6 or more, even with a "
        "temperature or top-k on one side). A logprob of another token "
        "(gathered at the wrong index, a tokenizer or vocabulary offset, or the argmax "
        "token's instead of the sampled one's) makes every ratio meaningless: check how "
        "that column is gathered; or, with policies many versions apart, whether the "
        "trainer's policy has moved so far from the sampling one that its logprobs no "
        "longer follow the sampled tokens."
    )


def units_caveat(units: Mapping | None, mapping: Mapping[str, str] | None = None
                 ) -> str | None:
    """A one-line caveat naming the likely unit mistake (entropy in bits, logprobs in
    log10...) and only the columns it concerns when the fit's units check (a fit result's
    ``to_dict()["units"]``) matched one of :data:`UNIT_SIGNATURES`; else the caveat of a
    logprob column that holds another token's logprob (:func:`other_token_caveat`, when
    ``other_token`` is set); else the caveat of two logprob columns of different tokens
    (:func:`unrelated_caveat`, when ``unrelated`` is set); else the caveat of a scaled
    entropy column (:func:`entropy_scale_caveat`, when ``entropy_scale`` is set); else the
    caveat of an entropy
    and logprobs that do not
    describe one sampling distribution (:func:`entropy_mismatch_caveat`, when
    ``entropy_mismatch`` is set); else None.

    Args:
        units: ``ratio_binned``, ``train_over_infer`` and ``likely_mistake`` of
            :class:`entr_diag.fit.UnitsCheck`.
        mapping: canonical column -> source column, to name the columns concerned.
    """
    key = (units or {}).get("likely_mistake")
    if key not in UNIT_SIGNATURES:
        if (units or {}).get("other_token"):
            return other_token_caveat(units, mapping)  # type: ignore[arg-type]
        if (units or {}).get("unrelated"):
            return unrelated_caveat(units, mapping)  # type: ignore[arg-type]
        if (units or {}).get("entropy_scale"):
            return entropy_scale_caveat(units, mapping)  # type: ignore[arg-type]
        if (units or {}).get("entropy_mismatch"):
            return entropy_mismatch_caveat(units, mapping)  # type: ignore[arg-type]
        return None
    canon, unit, to_nats, f_ratio, f_train = UNIT_SIGNATURES[key]
    m = mapping or {}
    cols = " and ".join(column_named(c, m) for c in canon)
    one = len(canon) == 1
    if math.isnan(f_ratio):  # the trainer's column alone
        seen = (f"train_logprob averages {units['train_over_infer']:.3f} times infer_logprob "
                f"on the same tokens, near 1/{to_nats} = {f_train:.3f}, where both sides in "
                "nats give about 1")
    else:
        spread = units.get("ratio_spread", math.nan)
        within = (f" (those holding 80% of the entropy {_alike(spread)})"
                  if math.isfinite(spread) else "")
        seen = (f"the sampled tokens' surprisal (-infer_logprob) averages "
                f"{units['ratio_binned']:.3f} times their entropy alike in the entropy "
                f"bins{within}, near {'1/' if 'logprob' in key else ''}{to_nats} = "
                f"{f_ratio:.3f}, where it "
                "is 1 in nats (E[-log mu(y)] = H(mu) for tokens sampled from mu)")
        if key.startswith("infer_"):
            seen += (f"; train_logprob averages {units['train_over_infer']:.3f} times "
                     "infer_logprob, so train_logprob is in nats")
    mixed = key.startswith(("infer_", "train_"))
    return (
        f"caveat: {cols} probably {'holds' if one else 'hold'} {unit}, not nats: {seen}. "
        + ("Delta then mixes two units and means nothing"
           if mixed else "The fitted law and the ENTR gate's budget are then off by a "
           "constant factor")
        + f": multiply the {'column' if one else 'columns'} by {to_nats}"
        + (f" (unless that side's logprobs were divided by a sampling temperature of "
           f"{_TEMPERATURE_ALIKE[to_nats]}, which scales them alike: check the sampler's "
           "temperature before rescaling)." if mixed
           else " (unless the engine sampled with a temperature or top-p that "
           "the logged values leave out).")
    )


#: the temperature T whose logprobs / T one side's column in another base reads like
#: (log2 values are ln p / ln 2: ln p divided by T = ln 2)
_TEMPERATURE_ALIKE: dict[str, str] = {"ln 2": "ln 2 = 0.69", "ln 10": "ln 10 = 2.3"}

