"""HTML post-mortem report: structure, self-containment, escaping, unavailable sections, and a
real headless-Chromium render (every figure drawn, no console error)."""

from __future__ import annotations

import html as html_mod
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import plotly.offline
import pytest

from entr_diag.report.html_report import build_report_html, write_report

SECTION_IDS = ("summary", "scaling", "prob", "gates", "training", "switches", "offenders")
PLOTLY_MARK = "plotly.js v"  # the banner comment of the embedded bundle


# ----------------------------------------------------------------------------- inputs


def _summary(files=("run/step_0001.parquet",)) -> dict:
    return {
        "tool_version": "0.1.0",
        "created_at": "2026-11-30T12:00:00+00:00",
        "inputs": {
            "files": list(files),
            "layout": "long",
            "tokens_total": 1200,
            "tokens_valid": 1000,
            "sequences": 10,
        },
        "mapping": {"train_logprob": "old_log_probs", "infer_logprob": "rollout_log_probs"},
        "exclusions": {"sentinel_logprob": 150, "non_finite_logprob": 50},
        "entropy_source": "inference",
        "parameters": {"tau": 4.0, "eps": 0.01, "bins": 6},
    }


def _fit() -> dict:
    hs = [1e-3, 1e-2, 3e-2, 0.1, 0.5, 2.0]
    bins = []
    for i, h in enumerate(hs):
        y = 0.02 * h + (0.05 if h < 0.02 else 0.0)
        bins.append(
            {
                "index": i,
                "h_lo": h / 2,
                "h_hi": h * 2,
                "tokens": 100,
                "sequences": 10,
                "mean_h": h,
                "mean_delta2": y,
                "mean_delta2_ci": [0.8 * y, 1.2 * y],
                "in_fit": h >= 0.02,
            }
        )
    return {
        "parameters": {"tau": 4.0, "eps": 0.01},
        "bins": bins,
        "laws": {
            "proportional": {"k": 0.02, "k_ci": [0.018, 0.022]},
            "affine": {"k": 0.02, "k_ci": [0.018, 0.022], "c": 1e-5},
            "power": {
                "k": 0.02,
                "k_ci": [0.018, 0.022],
                "alpha": 1.0,
                "alpha_ci": [0.95, 1.05],
                "h_range": [0.02, 4.0],
            },
        },
        "breakpoint": {"h_star": 0.02, "h_star_ci": [0.015, 0.03]},
        "regime": {
            "share_below_h_star": 0.2,
            "delta2_mass_share_below_h_star": 0.6,
            "flagged_tokens": 17,
            "share_flagged": 0.017,
            "delta2_mass_share_flagged": 0.38,
            "rule": "H < H* and delta^2/(H + 0.01) > 4",
        },
        "strata": {
            "staleness": [
                {
                    "label": "0",
                    "tokens": 500,
                    "k": 0.02,
                    "k_proportional": 0.02,
                    "k_proportional_ci": [0.018, 0.022],
                },
                {
                    "label": "1",
                    "tokens": 500,
                    "k": 0.03,
                    "k_proportional": 0.03,
                    "k_proportional_ci": [0.025, 0.035],
                },
            ],
            "step": [],
            "notices": ["step strata skipped: no step column"],
        },
        "verdict": {
            "text": "law holds: alpha = 1.00 [0.95, 1.05]",
            "law": "holds",
            "noise_regime": True,
        },
    }


def _metrics() -> dict:
    per_step = [
        {"step": s, "tokens": 100, "kl": 1e-3 * s, "k3_kl": 5e-4, "chi2_token": 0.01, "ess": 0.99}
        for s in range(5)
    ]
    return {"overall": dict(per_step[0]), "per_step": per_step}


def _gate(name: str, label: str, kept: int, agreement: bool) -> dict:
    edges = [0.0, 0.01, 0.1, 1.0, 10.0]
    g = {
        "name": name,
        "spec": label,
        "label": label,
        "level": "token",
        "n_tokens": 1000,
        "kept_tokens": kept,
        "kept_share": kept / 1000,
        "dropped_tokens": 1000 - kept,
        "kept_sequence_share": 1.0,
        "keep_by_entropy": {
            "keys": ["a", "b", "c", "d"],
            "edges": edges,
            "n": [250] * 4,
            "kept": [240] * 4,
            "keep_rate": [0.96] * 4,
        },
        "keep_by_step": {
            "keys": [0, 1, 2],
            "n": [300, 300, 400],
            "kept": [290] * 3,
            "keep_rate": [0.97, 0.96, 0.95],
        },
        "noise_admitted": 0.1,
        "exploration_discarded": 0.01,
        "agreement_vs_entr": None,
    }
    if agreement:
        four = {
            "both_keep": [200] * 4,
            "only_entr_keeps": [10, 5, 20, 40],
            "only_other_keeps": [30, 5, 1, 0],
            "both_drop": [10] * 4,
        }
        g["agreement_vs_entr"] = {
            "both_keep": 800,
            "only_entr_keeps": 75,
            "only_other_keeps": 36,
            "both_drop": 89,
            "by_entropy": {"keys": ["a", "b", "c", "d"], "edges": edges, **four},
        }
    return g


def _compare() -> dict:
    return {
        "parameters": {"tau": 4.0, "eps": 0.01},
        "gates": [
            _gate("entr", "ENTR tau=4", 950, False),
            _gate("fixed", "fixed c=0.5", 900, True),
        ],
        "matched": {
            "c": 0.3,
            "entr_dropped": 50,
            "fixed_dropped": 50,
            "fixed": _gate("fixed", "fixed c=0.3", 950, True),
        },
        "sweep": {
            "tau": {
                "parameter": "tau",
                "gate": "entr",
                "values": [0.5, 1, 2, 4, 8],
                "keep_rate": [0.8, 0.85, 0.9, 0.95, 0.97],
                "noise_admitted": [0.01, 0.02, 0.05, 0.1, 0.2],
                "exploration_discarded": [0.05, 0.03, 0.02, 0.01, 0.005],
            },
        },
        "null_reasons": {},
    }


def _profiles() -> dict:
    import polars as pl

    from entr_diag.profiles import compute_profiles

    rng = np.random.default_rng(0)
    n = 2000
    seq = rng.integers(0, 20, n)
    il = -rng.exponential(1.0, n)
    d = rng.normal(0, 0.05, n)
    lf = (
        pl.DataFrame(
            {
                "seq_id": seq.astype(str),
                "infer_logprob": il,
                "train_logprob": il + d,
                "entropy": rng.exponential(0.5, n),
                "step": seq // 5,
                "token_id": rng.integers(0, 100, n),
            }
        )
        .with_columns(
            pl.col("seq_id").hash().alias("seq_key"),
            pl.int_range(pl.len()).over("seq_id").cast(pl.Int64).alias("position"),
            (pl.col("train_logprob") - pl.col("infer_logprob")).alias("delta"),
        )
        .with_columns((pl.col("position") >= 40).cast(pl.Int64).alias("policy_version"))
        .lazy()
    )
    return compute_profiles(lf).to_dict()


@pytest.fixture(scope="module")
def full_html() -> str:
    findings = [
        {
            "kind": "noise_regime",
            "severity": "warning",
            "message": "1.7% of tokens carry 38% of the delta^2 mass",
            "evidence": {"h_star": 0.02},
        }
    ]
    return build_report_html(
        summary=_summary(),
        fit=_fit(),
        metrics=_metrics(),
        compare=_compare(),
        profiles=_profiles(),
        findings=findings,
    )


def _has(text: str, part: str) -> bool:
    """``part in text`` without pytest diffing megabytes of HTML on failure."""
    return part in text


def _figure_count(h: str) -> int:
    return h.count('data-entr-figure="1"')


def _unavailable(h: str) -> list[str]:
    return re.findall(r'<div class="unavailable">unavailable: ([^<]*)</div>', h)


# ----------------------------------------------------------------------------- structure


def test_every_section_present_with_how_to_read(full_html):
    """All seven sections and the findings appear; every figure has a "how to read" line."""
    for sid in (*SECTION_IDS, "findings"):
        assert _has(full_html, f'id="{sid}"')
    n = _figure_count(full_html)
    assert n == 11
    assert full_html.count("<b>How to read this:</b>") >= n
    assert _unavailable(full_html) == []


def test_plotly_embedded_once_and_no_network(full_html):
    """plotly.js is inlined exactly once; nothing is loaded from the network (no src/href URL,
    no MathJax)."""
    assert full_html.count(PLOTLY_MARK) == 1
    assert not _has(full_html, "<script src")
    # outside the plotly.js bundle (whose strings name map-tile servers it never fetches
    # here), no attribute points at the network
    js = plotly.offline.get_plotlyjs()
    assert full_html.count(js) == 1
    rest = full_html.replace(js, "")
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', rest)
    assert not _has(rest, "MathJax") and not _has(rest, "cdn.")
    assert full_html.count("Plotly.newPlot(") == _figure_count(full_html)


def test_summary_carries_inputs_and_verdicts(full_html):
    """The summary states the verdict, the regime, the gate comparison and the inputs."""
    assert _has(full_html, "law holds: alpha = 1.00 [0.95, 1.05]")
    assert _has(full_html, "H* = 0.02 nats [0.015, 0.03]")
    assert _has(full_html, "the fixed band dropping as many tokens (c = 0.3 nats)")
    for s in ("run/step_0001.parquet", "old_log_probs", "sentinel_logprob", "2026-11-30T12:00:00"):
        assert _has(full_html, s)
    assert _has(full_html, "inference")


def test_entropy_in_bits_says_so_beside_h_star():
    """When the fit's units check reads the entropy column as bits, H* (summary, scaling
    figure) and the scaling figure's entropy axis say the column's unit, with H* in nats."""
    import math

    fit = _fit()
    fit["units"] = {"likely_mistake": "entropy_bits"}
    compare = _compare()
    compare["parameters"]["entropy_unit"] = "bits"
    h = build_report_html(summary=_summary(), fit=fit, metrics=_metrics(), compare=compare,
                          profiles=_profiles(), findings=[])
    text = html_mod.unescape(h)
    nats = f"{0.02 * math.log(2):.3g}"
    assert _has(text, "H* = 0.02 [0.015, 0.03] in the entropy column's unit (probably bits; "
                      f"{nats} [")
    assert _has(text, "entropy H (probably bits, as the column reads, bin mean)")
    assert _has(text, "entropy H (probably bits, as the column reads)")  # keep vs entropy
    assert _has(text, "entropy H (probably bits, as the column reads, log scale")  # density
    assert _has(text, "H* = 0.02 (probably bits, as the column reads)")
    assert not _has(text, "H* = 0.02 nats") and not _has(text, "entropy H (nats")

def test_entr_noise_admitted_is_marked_as_by_definition():
    """The ENTR gate that defines the noise tokens (same tau and eps as the flag) admits
    none of them by definition: the summary and the gate table say so instead of
    presenting 0% as a result; an ENTR gate at another tau keeps its plain share."""
    cmp_ = _compare()
    cmp_["parameters"].update(flag_tau=4.0, flag_eps=0.01)
    entr = cmp_["gates"][0]
    entr.update(params={"tau": 4.0, "eps": 0.01}, noise_admitted=0.0)
    h = build_report_html(summary=_summary(), fit=_fit(), metrics=_metrics(), compare=cmp_,
                          profiles=_profiles())
    assert _has(h, "admits none of the noise tokens, by definition: they are the tokens it "
                   "drops below H*")
    assert _has(h, "0% (by definition)")
    entr["params"] = {"tau": 8.0, "eps": 0.01}
    h = build_report_html(summary=_summary(), fit=_fit(), metrics=_metrics(), compare=cmp_,
                          profiles=_profiles())
    assert not _has(h, "(by definition)") and _has(h, "admits 0% of the noise tokens")


def test_verdict_caveat_under_the_verdict(full_html):
    """A fit whose verdict carries a caveat (few sequences) shows it under the verdict; one
    without shows none."""
    fit = _fit()
    fit["verdict"] = {**fit["verdict"], "caveat": "caveat: only 3 sequences to resample"}
    html = build_report_html(summary=_summary(), fit=fit, metrics=_metrics(),
                             compare=_compare(), profiles=_profiles(), findings=[])
    i = html.index('<p class="caveat">caveat: only 3 sequences to resample</p>')
    assert html.index("law holds: alpha = 1.00") < i < html.index("Noise regime:")
    assert not _has(full_html, '<p class="caveat">')


def test_metrics_caption_says_what_they_measure_under_truncated_sampling(full_html):
    """A truncated-sampling finding at warning severity: the per-step metrics' caption says
    they measure the support difference; at info, or without it, it says nothing."""
    f = {"kind": "truncated_sampling", "severity": "warning", "title": "t", "message": "m",
         "evidence": {}, "check": "c"}
    args = dict(summary=_summary(), fit=_fit(), metrics=_metrics(), compare=_compare(),
                profiles=_profiles())
    h = build_report_html(**args, findings=[f])
    assert _has(h, "The engine samples from a truncated support")
    assert h.index("5. Over training") < h.index("Mismatch metrics per step") < h.index(
        "truncated support")
    h = build_report_html(**args, findings={"findings": [{**f, "severity": "info"}]})
    assert not _has(h, "truncated support")
    assert not _has(full_html, "truncated support")


def test_offender_tables_rendered(full_html):
    """The worst-offender tables list tokens and sequences with their keys."""
    seg = full_html[full_html.index('id="offenders"') :]
    assert _has(seg, "Top tokens by score = delta^2/(H+eps)")
    assert seg.count("<tr>") >= 2 * 20


def test_text_is_escaped():
    """File names, findings and gate labels are HTML-escaped (no markup injection)."""
    evil = "<script>alert(1)</script>"
    comp = _compare()
    comp["gates"][1]["label"] = evil
    h = build_report_html(
        summary=_summary(files=[evil]),
        fit=_fit(),
        metrics=None,
        compare=comp,
        profiles={},
        findings=[{"kind": "x", "severity": "error", "message": evil, "evidence": evil}],
    )
    assert not _has(h, evil)
    assert _has(h, html_mod.escape(evil))


def test_missing_results_say_unavailable():
    """Without fit, metrics, compare and profiles every figure is an "unavailable" note."""
    h = build_report_html(summary=_summary(), fit=None, metrics=None, compare=None, profiles={})
    assert _figure_count(h) == 0
    notes = _unavailable(h)
    assert len(notes) >= 10
    assert all(n.strip() for n in notes)
    assert 'id="findings"' not in h


def test_unavailable_reasons_from_profiles():
    """A profile that could not be computed shows its own reason."""
    prof = _profiles()
    prof["version_switch"] = {
        "available": False,
        "reason": "the data carry no policy_version column",
    }
    h = build_report_html(
        summary=_summary(), fit=_fit(), metrics=_metrics(), compare=_compare(), profiles=prof
    )
    assert _has(h, "unavailable: the data carry no policy_version column")


def test_json_nulls_are_tolerated():
    """NaN written as null by the JSON writer (None here) never crashes the renderer."""
    fit = _fit()
    fit["bins"][0]["mean_delta2_ci"] = [None, None]
    fit["laws"]["affine"]["c"] = None
    comp = _compare()
    comp["gates"][0]["noise_admitted"] = None
    comp["gates"][0]["keep_by_entropy"]["keep_rate"][0] = None
    h = build_report_html(
        summary=_summary(),
        fit=fit,
        metrics=_metrics(),
        compare=comp,
        profiles=json.loads(json.dumps(_profiles())),
    )
    assert _figure_count(h) >= 10


def test_write_report_atomic(tmp_path, full_html):
    """write_report writes the whole file and leaves no temporary file behind."""
    out = write_report(tmp_path / "r.html", full_html)
    assert out.read_text(encoding="utf-8") == full_html
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]


def test_size_does_not_grow_with_tokens(full_html):
    """The report is a few MB: plotly.js plus figures built from aggregates."""
    assert len(full_html.encode()) < 6_000_000


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def synth_html(tmp_path_factory) -> str:
    """A report of a tiny synthetic run built through the library, as the CLI does."""
    from entr_diag.compare import compare_gates
    from entr_diag.fit import fit_scaling_law
    from entr_diag.io.load import load_dataset
    from entr_diag.metrics import compute_metrics
    from entr_diag.profiles import compute_profiles
    from entr_diag.synth import SynthSpec, write_synth

    path = tmp_path_factory.mktemp("synth") / "run.parquet"
    write_synth(path, SynthSpec(n_tokens=30_000, seed=3, dirty=True))
    ds = load_dataset([path])
    fit = fit_scaling_law(ds.lf, bins=20, n_boot=100, seed=0)
    fd = fit.to_dict()
    bp = fd["breakpoint"]
    cmp_ = compare_gates(
        ds.lf,
        h_star=None if bp is None else bp["h_star"],
        law_k=fd["laws"]["power"]["k"],
        law_alpha=fd["laws"]["power"]["alpha"],
    )
    desc = ds.describe()
    acc = desc["accounting"]
    summary = {
        "tool_version": "test",
        "created_at": "2026-11-30T12:00:00+00:00",
        "inputs": {
            "files": [f["path"] for f in desc["files"]],
            "layout": desc["layout"],
            "tokens_total": acc.get("tokens_total"),
            "tokens_valid": acc.get("tokens_valid"),
            "sequences": acc.get("sequences_valid"),
        },
        "mapping": desc["mapping"],
        "exclusions": acc.get("exclusions"),
        "entropy_source": desc["entropy_source"],
        "parameters": {"tau": 4.0, "eps": 0.01},
    }
    return build_report_html(
        summary=summary,
        fit=fd,
        metrics=compute_metrics(ds.lf).to_dict(),
        compare=cmp_.to_dict(),
        profiles=compute_profiles(ds.lf).to_dict(),
    )


def test_synth_run_renders_every_figure(synth_html):
    """On a synthetic run with steps, versions and a planted regime no figure is unavailable."""
    assert _unavailable(synth_html) == []
    assert _figure_count(synth_html) == 11
    assert _has(synth_html, "noise regime")


# ----------------------------------------------------------------------------- browser


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        p = shutil.which(name)
        if p:
            return p
    return None


_PROBE = """<script>
window.__entrErrors = [];
window.addEventListener("error", function (e) {
  window.__entrErrors.push("error: " + (e.message || (e.target && e.target.outerHTML) || e));
}, true);
window.addEventListener("unhandledrejection", function (e) {
  window.__entrErrors.push("unhandledrejection: " + String(e.reason));
});
(function () {
  var orig = console.error;
  console.error = function () {
    window.__entrErrors.push("console.error: " + Array.prototype.join.call(arguments, " "));
    return orig.apply(console, arguments);
  };
})();
window.addEventListener("load", function () {
  setTimeout(function () {
    var pre = document.createElement("pre");
    pre.id = "entr-probe";
    pre.textContent = JSON.stringify(window.__entrErrors);
    document.body.appendChild(pre);
  }, 500);
});
</script>"""


def render_in_chromium(
    html_text: str, workdir: Path, *, screenshot: Path | None = None, window: str = "1400,4000"
) -> tuple[str, str]:
    """Load ``html_text`` in headless Chromium (no network) and return (DOM after scripts,
    stderr). A probe injected first in <head> records JS errors, unhandled rejections and
    console.error calls into ``<pre id="entr-probe">``."""
    browser = _chromium()
    assert browser is not None
    page = workdir / "page.html"
    page.write_text(html_text.replace("<head>", "<head>" + _PROBE, 1), encoding="utf-8")
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--mute-audio",
        f"--user-data-dir={workdir / 'profile'}",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        f"--window-size={window}",
        "--virtual-time-budget=15000",
        "--enable-logging=stderr",
        "--v=0",
    ]
    if screenshot is not None:
        flags.append(f"--screenshot={screenshot}")
    else:
        flags.append("--dump-dom")
    proc = subprocess.run(
        [browser, *flags, page.as_uri()], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, proc.stderr


def _need_chromium() -> None:
    if _chromium() is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true but no chromium on PATH: install Debian's `chromium` package")
        pytest.skip("chromium not installed (apt-get install chromium)")


def _probe_errors(dom: str) -> list[str]:
    m = re.search(r'<pre id="entr-probe">(.*?)</pre>', dom, re.S)
    assert m, "the page never finished loading (probe missing)"
    return json.loads(html_mod.unescape(m.group(1)))


@pytest.mark.browser
def test_browser_probe_catches_errors(tmp_path):
    """The probe used below does report a thrown error and a console.error (no false pass)."""
    _need_chromium()
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'></head><body><p>x</p>"
        "<script>console.error('bad thing');</script>"
        "<script>throw new Error('boom');</script></body></html>"
    )
    dom, _ = render_in_chromium(page, tmp_path)
    errors = _probe_errors(dom)
    assert any("bad thing" in e for e in errors)
    assert any("boom" in e for e in errors)


@pytest.mark.browser
def test_report_renders_in_headless_chromium(synth_html, tmp_path):
    """Chromium loads the report with no console error and every plotly figure drew its SVG."""
    _need_chromium()
    dom, stderr = render_in_chromium(synth_html, tmp_path)
    errors = _probe_errors(dom)
    assert errors == []
    console = [ln for ln in stderr.splitlines() if "CONSOLE" in ln and "ERROR" in ln.upper()]
    assert console == [], console
    # every figure div holds a rendered plotly SVG
    ids = re.findall(r'<div class="fig[^"]*" id="(fig-\d+)" data-entr-figure="1"', synth_html)
    assert len(ids) == 11
    starts = [dom.index(f'id="{fid}"') for fid in ids] + [len(dom)]
    for fid, a, b in zip(ids, starts[:-1], starts[1:], strict=True):
        assert 'class="main-svg"' in dom[a:b], f"{fid} did not render"


def test_forensics_findings_dict_rendered():
    """Findings.to_dict() (findings + check statuses) renders with title, evidence and checks."""
    findings = {
        "findings": [
            {
                "kind": "misalignment",
                "severity": "critical",
                "title": "logprobs shifted by one token",
                "message": "train and infer logprobs match best at lag +1",
                "evidence": {"best_lag": 1, "mean_abs_diff": [0.1, 2.6]},
                "check": "the response slicing in the trainer",
            }
        ],
        "checks": {
            "misalignment": {"status": "found", "reason": "lag +1 fits best"},
            "trainer_noise_floor": {"status": "cannot_tell", "reason": "no recompute column"},
        },
    }
    h = build_report_html(
        summary=_summary(), fit=None, metrics=None, compare=None, profiles={}, findings=findings
    )
    seg = h[h.index('id="findings"') : h.index('id="summary"')]
    for s in (
        "logprobs shifted by one token",
        "best_lag = 1",
        "what to check: the response slicing in the trainer",
        "cannot_tell",
        "no recompute column",
        'class="sev-critical"',
        "found: critical",
        "2 checks: 1 cannot tell, 1 found: critical",
    ):
        assert _has(seg, s), s
    assert h.index('id="findings"') < h.index('id="summary"')


def _mangle(o, rng, p):
    """Randomly drop keys and null numbers, as a result of an unexpected shape would."""
    if isinstance(o, dict):
        return {k: _mangle(v, rng, p) for k, v in o.items() if rng.random() >= p / 2}
    if isinstance(o, list):
        return [_mangle(v, rng, p) for v in o]
    if isinstance(o, (int, float)) and not isinstance(o, bool) and rng.random() < p:
        return rng.choice([None, float("nan"), 0, -1.0, float("inf")])
    return o


def test_malformed_results_never_crash_the_report():
    """Missing keys or nulls in any result make single figures say unavailable, never crash."""
    import random

    base = {
        "summary": _summary(),
        "fit": _fit(),
        "metrics": _metrics(),
        "compare": _compare(),
        "profiles": _profiles(),
    }
    for seed in range(25):
        rng = random.Random(seed)
        kw = {k: _mangle(v, rng, 0.25) for k, v in base.items()}
        h = build_report_html(**kw)
        assert _has(h, 'id="offenders"')


def test_bundled_sample_report_has_no_shape_errors():
    """The bundled real-model run (no noise regime, gates that keep everything) renders every
    section; what it cannot show says why, never a shape error."""
    from entr_diag.compare import compare_gates
    from entr_diag.fit import fit_scaling_law
    from entr_diag.io.load import bundled_sample_path, load_dataset
    from entr_diag.metrics import compute_metrics
    from entr_diag.profiles import compute_profiles

    if not bundled_sample_path().exists():
        pytest.skip("bundled sample run not generated")
    ds = load_dataset(None)
    fd = fit_scaling_law(ds.lf, bins=20, n_boot=100, seed=0).to_dict()
    bp = fd["breakpoint"]
    cmp_ = compare_gates(
        ds.lf,
        h_star=None if bp is None else bp["h_star"],
        law_k=fd["laws"]["power"]["k"],
        law_alpha=fd["laws"]["power"]["alpha"],
    )
    h = build_report_html(
        summary=_summary(),
        fit=fd,
        metrics=compute_metrics(ds.lf).to_dict(),
        compare=cmp_.to_dict(),
        profiles=compute_profiles(ds.lf).to_dict(),
    )
    notes = _unavailable(h)
    assert not [n for n in notes if "expected shape" in n], notes
    assert _figure_count(h) >= 9


def test_power_law_legend_carries_the_robust_alpha():
    """The scaling figure's power-law legend names the Theil-Sen alpha beside the
    least-squares one, and says when they disagree; a fit without it shows only the latter."""
    fit = _fit()
    fit["laws"]["power"]["robust"] = {"alpha": 0.72, "k": 0.01, "disagrees": True}
    html = build_report_html(summary=_summary(), fit=fit, metrics=_metrics(),
                             compare=_compare(), profiles=_profiles(), findings=[])
    # (plotly's figure JSON escapes the α, or not when orjson is installed)
    assert any(_has(html, f"Theil-Sen {a} = 0.72 (disagrees)") for a in ("α", "\\u03b1"))
    plain = build_report_html(summary=_summary(), fit=_fit(), metrics=_metrics(),
                              compare=_compare(), profiles=_profiles(), findings=[])
    assert not _has(plain, "Theil-Sen")


def test_strata_figure_shows_alpha_beside_its_random_size_range():
    """Under the k panel, each stratum's alpha with its interval, beside the alpha range of
    a random sample of its size (grey); strata without them plot nothing there."""
    from entr_diag.report.html_report import _strata_fig

    fit = _fit()
    rows = fit["strata"]["staleness"]
    rows[0].update(alpha=1.2, alpha_ci=[1.1, 1.3], alpha_random_ci=[0.9, 1.1])
    fig = _strata_fig(fit)
    grey = [t for t in fig.data if t.marker.color == "#9ca3af"]
    assert len(grey) == 1 and grey[0].y[0] == pytest.approx(1.0)
    assert list(grey[0].error_y.array)[0] == pytest.approx(0.1)
    alpha = [t for t in fig.data if t.yaxis == grey[0].yaxis and t is not grey[0]]
    assert alpha[0].y[0] == 1.2 and alpha[0].y[1] is None  # (no alpha for stratum 1)
    assert list(alpha[0].error_y.arrayminus)[0] == pytest.approx(0.1)


def test_degenerate_inputs_get_readable_axes_and_a_forensics_line():
    """One step, every gate keeping everything: the y axes span 0 to about the one value
    (plotly drew a 100% keep rate on 0 to 200%, a k1 KL of 4.4e-4 on -1 to 1, where it
    read as 0); without a fit the summary still has its Forensics line, made from the
    findings (helper-43)."""
    from entr_diag.report.html_report import _flat_range, _keep_vs_entropy_fig, _metrics_fig

    assert _flat_range([1.0, 1.0]) == [0.0, 1.05] and _flat_range([4.4e-4]) == [0.0, 8.8e-4]
    assert _flat_range([0.5, 0.6]) is None and _flat_range([None]) is None
    met = _metrics()
    met["per_step"] = [{"step": 0, "kl": 4.4e-4, "k3_kl": 1e-4, "chi2_token": 2e-3,
                        "ess": 0.99}]
    lay = _metrics_fig(met).to_plotly_json()["layout"]
    assert lay["yaxis"]["range"] == [0.0, 8.8e-4]
    comp = _compare()
    for g in comp["gates"]:
        if isinstance(g.get("keep_by_entropy"), dict):
            g["keep_by_entropy"]["keep_rate"] = [1.0] * len(g["keep_by_entropy"]["keep_rate"])
    assert _keep_vs_entropy_fig(comp).to_plotly_json()["layout"]["yaxis"]["range"] == [0, 1.05]
    # the gates' n/a reasons: one sentence per cause, no raw JSON keys
    why = "no scaling law could be fitted (one sequence block: x)"
    comp["null_reasons"] = {"noise_admitted": f"{why}: there is no entropy breakpoint H*",
                            "exploration_discarded": f"{why}: the law's scale is undefined"}
    h = build_report_html(summary=_summary(), fit=None, metrics=None, compare=comp,
                          profiles={}, findings=[])
    assert _has(h, f"n/a noise admitted and exploration discarded: {why}: there is no "
                   "entropy breakpoint H*; the law&#x27;s scale is undefined.")
    assert "noise_admitted" not in h.split('id="gates"')[1].split("<script")[0]
    findings = {"findings": [], "checks": {"drift": {"status": "cannot_tell", "reason": "x"},
                                           "staleness": {"status": "clear", "reason": "y"}}}
    h = build_report_html(summary=_summary(), fit=None, metrics=None, compare=None,
                          profiles={}, findings=findings)
    seg = h[h.index('id="summary"'):]
    assert _has(seg, "Forensics: no known cause of mismatch found (1 of 2 checks clear")


def test_keep_rate_by_staleness_is_a_table_of_the_report():
    """The report shows each token gate's keep rate per staleness bucket, as compare prints
    it and as the README says (helper-43: only the terminal had it); none without it."""
    comp = _compare()
    for g, rates in zip(comp["gates"], ([1.0, 0.5], [0.99, 0.25]), strict=False):
        g["keep_by_staleness"] = {"keys": ["0", "2-3"], "n": [900, 100], "keep_rate": rates}
    h = build_report_html(summary=_summary(), fit=_fit(), metrics=_metrics(), compare=comp,
                          profiles=_profiles(), findings=[])
    seg = h[h.index("Keep rate by staleness"):]
    seg = seg[:seg.index("</table>")]
    for x in ("2-3", "25%", "50%", "99%", "900"):
        assert _has(seg, x), x
    plain = build_report_html(summary=_summary(), fit=_fit(), metrics=_metrics(),
                              compare=_compare(), profiles=_profiles(), findings=[])
    assert "Keep rate by staleness" not in plain


def test_input_warnings_head_the_findings_card():
    """The command's warnings about the input (entropy in bits, a truncation the logs leave
    out...) are listed first in the Findings card at the top, not only beside the verdict
    (helper-43: the card showed one info finding under a top-p run's warning); with no
    finding, the card still says the checks found no cause."""
    summ = _summary()
    summ["warnings"] = ["entropy probably holds bits (log base 2), not nats"]
    findings = {"findings": [], "checks": {"drift": {"status": "clear", "reason": "flat"}}}
    h = build_report_html(summary=summ, fit=None, metrics=None, compare=None, profiles={},
                          findings=findings)
    seg = h[h.index('id="findings"'):h.index('id="summary"')]
    assert _has(seg, "entropy probably holds bits (log base 2), not nats")
    assert 'class="sev-warning"' in seg
    assert _has(seg, "No cause of mismatch was found by the forensics checks.")
    h = build_report_html(summary=summ, fit=None, metrics=None, compare=None, profiles={},
                          findings=[])
    assert 'id="findings"' in h and _has(h[h.index('id="findings"'):h.index('id="summary"')],
                                         "entropy probably holds bits")


def test_strata_axes_are_categories_with_labels_on_both_rows():
    """Stratum labels such as '2-3' (read by plotly as a number) or '0-1' (as a date) stay
    categories on the k row and the alpha row alike, each row with its tick labels
    (helper-43: the 2-3 and 4-7 buckets vanished from the alpha row, step ranges read as
    dates)."""
    from entr_diag.report.html_report import _strata_fig

    fit = _fit()
    for r, lab in zip(fit["strata"]["staleness"], ["2-3", "4-7"], strict=False):
        r.update(label=lab, bucket=lab, alpha=1.2, alpha_ci=[1.1, 1.3])
    lay = _strata_fig(fit).to_plotly_json()["layout"]
    axes = [v for k, v in lay.items() if k.startswith("xaxis")]
    assert len(axes) == 2 and all(a.get("type") == "category" and a.get("showticklabels")
                                  for a in axes), axes


def test_sweep_marks_are_labelled_where_their_lines_are():
    """On the sweeps' log axes, the 'tau = 4' and 'matched c' labels sit at log10 of their
    values, beside their lines (helper-43: add_vline's own label put 'tau = 4' at 10^4, off
    the chart)."""
    from entr_diag.report.html_report import _sweep_fig

    comp = _compare()
    fig = _sweep_fig(comp).to_plotly_json()
    lines = {round(sh["x0"], 9) for sh in fig["layout"].get("shapes", [])}
    marks = [a for a in fig["layout"]["annotations"]
             if a["text"].strip().startswith(("tau =", "matched c ="))]
    assert any(a["text"].strip() == "tau = 4" for a in marks), marks
    for a in marks:
        assert round(10 ** a["x"], 9) in lines, (a, lines)


def test_a_share_short_of_one_never_reads_100_percent():
    """47 tokens dropped of 700,000 read '100%' kept beside the terminal's 99.99%: a share
    below 1 keeps the digits that show it, one above 0 never reads 0%."""
    from entr_diag.report.html_report import _pct

    assert _pct(1.0) == "100%" and _pct(0.0) == "0%" and _pct(0.5) == "50%"
    assert _pct(1 - 47 / 700_000) == "99.9933%"
    assert _pct(0.9995) == "99.950%" and _pct(0.99949) == "99.9%"
    assert _pct(1e-7) == "1e-05%"


def test_gates_on_one_point_of_the_tradeoff_name_each_other():
    """Gates at the same (exploration discarded, noise admitted), e.g. every gate keeping
    everything at (0%, 100%), hide each other's markers: each hover names the others."""
    from entr_diag.report.html_report import _noise_vs_expl_fig

    def g(name, ed, na):
        return {"name": name, "label": name, "spec": name, "level": "token",
                "exploration_discarded": ed, "noise_admitted": na}

    compare = {"gates": [g("entr", 0.0, 0.0), g("tis", 0.0, 1.0), g("veto", 0.0, 1.0),
                         g("m2po", 0.0, 1.0), g("fixed", 0.2, 0.3)]}
    fig = _noise_vs_expl_fig(compare)
    hover = {t.name: t.hovertemplate for t in fig.data}
    assert "at the same point: veto, m2po" in hover["tis"]
    assert "at the same point: tis, m2po" in hover["veto"]
    assert "same point" not in hover["entr"] and "same point" not in hover["fixed"]


def test_gate_colours_are_far_apart():
    """Every two colours of the gate palette differ by 50 or more in RGB (helper-43: violet
    #7c3aed and purple #9333ea, 24 apart, drew areal and m2po alike)."""
    import itertools
    import math

    from entr_diag.report.html_report import _PALETTE

    def rgb(h):
        return [int(h[i:i + 2], 16) for i in (1, 3, 5)]

    assert len(set(_PALETTE)) == len(_PALETTE) >= 12
    assert min(math.dist(rgb(a), rgb(b)) for a, b in itertools.combinations(_PALETTE, 2)) >= 50


def test_bins_not_fitted_say_why_in_legend_and_hover():
    """Hollow bins name why they are not fitted (helper-43: a 3-sequence run showed
    "not fitted" bins and a "power law extrapolated" line with no word of why): below
    the law regime (H*'s interval), under 10 tokens, or tokens of under 2 sequence blocks;
    the dotted power law is named as drawn beyond its fitted range."""
    from entr_diag.report.html_report import _scaling_fig

    fit = _fit()
    fit["bins"][4]["in_fit"] = False  # (h 0.5: above H*, 100 tokens: too few blocks)
    fit["bins"].append({**fit["bins"][5], "index": 6, "h_lo": 4.0, "h_hi": 8.0, "mean_h": 5.0,
                        "tokens": 7, "in_fit": False})
    fig = _scaling_fig(fit)
    (hollow,) = [t for t in fig.data if t.marker and t.marker.symbol == "circle-open"]
    assert hollow.name == ("mean δ² per bin, not fitted (noise regime, tokens of under 2 "
                           "sequence blocks, under 10 tokens)"), hollow.name
    hover = list(hollow.text)
    assert "not fitted: below the law regime (H < 0.03, the top of H*'s interval)" in hover[0]
    assert "fewer than 2 of the bootstrap's sequence blocks" in hover[-2]
    assert "not fitted: 7 tokens, under the 10 a fitted bin needs" in hover[-1]
    (solid,) = [t for t in fig.data if t.marker and t.marker.symbol == "circle"]
    assert "not fitted" not in " ".join(solid.text)
    assert "power law beyond its fitted range" in {t.name for t in fig.data}
    fit = _fit()
    fit["breakpoint"] = None
    for b in fit["bins"]:
        b["in_fit"] = b["mean_h"] > 0.02 or b["tokens"] < 10
    fit["bins"][0]["tokens"] = 5
    fit["bins"][0]["in_fit"] = False
    (hollow,) = [t for t in _scaling_fig(fit).data
                 if t.marker and t.marker.symbol == "circle-open"]
    assert "noise regime" not in hollow.name and "under 10 tokens" in hollow.name
