#!/usr/bin/env python3
"""Generate the bundled sample run of entr-diag with a REAL tiny model.

Nothing in here is synthetic noise: every log-probability and entropy in the output comes from
a forward pass of a small byte-level causal transformer.

1. Pre-train the transformer (fp32, CPU) on the source code of the Python standard library
   that ships with the running interpreter (top-level ``*.py`` files of ``Lib/``, sorted by
   name, files separated by byte 0 which doubles as end-of-sequence).
2. Simulate asynchronous RL post-training (REINFORCE with a group baseline):
   * the trainer holds fp32 weights; every optimizer step produces a new policy version;
   * the "inference engine" samples rollouts with a STALE copy of the weights (lag 0..3
     versions) cast to bfloat16 (weights and activations); ~20% of the sequences get an
     in-flight weight update mid-generation (the KV cache computed with the old weights is
     kept, as PipelineRL / AReaL do), so ``policy_version`` changes inside the sequence;
   * the trainer recomputes the sampled tokens' log-probabilities in fp32 at the current
     version (``train_logprob``, ``train_entropy``), then a second time with another
     micro-batch composition and padding (``train_logprob_recompute``);
   * the reward is the fluency of the response under the frozen pre-trained model (mean
     fp32 log-prob), which sharpens the policy and so feeds the low-entropy regime.
3. Write the run in the two canonical layouts (METHOD.md, "Canonical columns"):
   ``entr_diag/sample_data/sample_run_long.parquet`` and ``..._nested.parquet``.

Run:  pip install -e ".[sample]" && python sample_data/generate_sample_run.py
Torch is needed only here; the ``entr_diag`` package never imports it.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import random
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn as nn
import torch.nn.functional as F

SEED = 20260722
VOCAB = 256  # bytes; byte 0 separates files and acts as EOS
EOS = 0
REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "entr_diag" / "sample_data"


# ----------------------------------------------------------------------------- corpus
def load_corpus(max_bytes: int) -> tuple[bytes, list[str]]:
    """Top-level stdlib ``*.py`` files sorted by name, joined with byte 0, cut at max_bytes."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    parts, names, total = [], [], 0
    for p in sorted(lib.glob("*.py"), key=lambda q: q.name):
        data = p.read_bytes().replace(b"\x00", b"")
        parts.append(data + bytes([EOS]))
        names.append(p.name)
        total += len(data) + 1
        if total >= max_bytes:
            break
    return b"".join(parts)[:max_bytes], names


# ----------------------------------------------------------------------------- model
class Block(nn.Module):
    def __init__(self, d: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.use_sdpa = False
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x, attn_bias, past=None):
        """x: (B, T, d). attn_bias: (B or 1, 1, T, T_total) additive. past: (k, v) or None."""
        b, t, d = x.shape
        h = self.n_head
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q = q.view(b, t, h, d // h).transpose(1, 2)
        k = k.view(b, t, h, d // h).transpose(1, 2)
        v = v.view(b, t, h, d // h).transpose(1, 2)
        new_kv = (k, v)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        if self.use_sdpa:  # fused kernel: same maths, other floating-point order
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h)) + attn_bias
            y = torch.softmax(att, dim=-1) @ v
        y = y.transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return x, new_kv


class TinyLM(nn.Module):
    def __init__(self, d: int, n_layer: int, n_head: int, ctx: int) -> None:
        super().__init__()
        self.ctx = ctx
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList([Block(d, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)

    def forward(self, idx, pad_mask=None, past=None, start=0):
        """idx (B, T) -> logits (B, T, V), list of new (k, v) per layer.

        pad_mask: (B, T_total) bool, True on real tokens (keys); past: per-layer (k, v).
        """
        b, t = idx.shape
        dtype = self.tok.weight.dtype
        pos = torch.arange(start, start + t)
        x = self.tok(idx) + self.pos(pos)[None]
        t_total = start + t
        causal = torch.ones(t, t_total, dtype=torch.bool).tril(diagonal=start)
        allowed = causal[None, None]
        if pad_mask is not None:
            allowed = allowed & pad_mask[:, None, None, :]
        bias = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, -1e4)
        new = []
        for i, blk in enumerate(self.blocks):
            x, kv = blk(x, bias, None if past is None else past[i])
            new.append(kv)
        return self.head(self.ln_f(x)), new


# ----------------------------------------------------------------------------- helpers
def token_stats(logits: torch.Tensor, tokens: torch.Tensor):
    """fp32 log-prob of `tokens` and entropy (nats) of softmax(logits)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    ent = -(lp.exp() * lp).sum(-1)
    return lp.gather(-1, tokens[..., None]).squeeze(-1), ent


def pretrain(model, corpus: torch.Tensor, steps: int, batch: int, ctx: int, lr: float, gen, log):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    n = corpus.numel() - ctx - 1
    t0 = time.time()
    for it in range(steps):
        frac = it / max(1, steps - 1)
        for g in opt.param_groups:  # warmup then cosine
            g["lr"] = (
                lr * min(1.0, (it + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
            )
        ix = torch.randint(0, n, (batch,), generator=gen)
        xb = torch.stack([corpus[i : i + ctx] for i in ix.tolist()])
        yb = torch.stack([corpus[i + 1 : i + ctx + 1] for i in ix.tolist()])
        logits, _ = model(xb)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), yb.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if it % 250 == 0 or it == steps - 1:
            log(f"pretrain {it:5d}/{steps} loss {loss.item():.3f} ({time.time() - t0:.0f}s)")
    return loss.item()


@torch.no_grad()
def engine_generate(engines, prompts, plan, resp_len, tool_spans, gen, softmax_dtype):
    """Sample responses with bf16 engines whose version can change mid-sequence.

    engines: {version: bf16 TinyLM}. prompts: (B, P) long. plan: per row (v_start, switch_pos,
    v_end); the row uses v_start for response positions < switch_pos and v_end from there on
    (prompt prefill with v_start; the KV cache is kept across the switch). tool_spans: per row
    None or (start, tokens) forced (not sampled) response tokens.
    Returns tokens, infer_logprob, entropy, version (all (B, R)) and sampled (bool, (B, R)).
    """
    b, p = prompts.shape
    out_tok = torch.zeros(b, resp_len, dtype=torch.long)
    out_lp = torch.zeros(b, resp_len, dtype=torch.float32)
    out_h = torch.zeros(b, resp_len, dtype=torch.float32)
    out_v = torch.zeros(b, resp_len, dtype=torch.long)
    forced = torch.full((b, resp_len), -1, dtype=torch.long)
    for r, span in enumerate(tool_spans):
        if span is not None:
            s0, toks = span
            forced[r, s0 : s0 + len(toks)] = torch.tensor(toks)
    sampled = forced < 0

    v_start = torch.tensor([pl[0] for pl in plan])
    sw_pos = torch.tensor([pl[1] for pl in plan])
    v_end = torch.tensor([pl[2] for pl in plan])

    def version_at(pos: int) -> torch.Tensor:
        return torch.where(torch.tensor(pos) < sw_pos, v_start, v_end)

    def step_forward(inp, caches, start, ver):
        """One forward of every row with the weights of its own version; returns the
        last-position logits and the new per-layer (k, v) of the input positions."""
        new_kv, logits = None, None
        for v in sorted(set(ver.tolist())):
            rows = ver == v
            lg, kv = engines[v](inp, past=caches, start=start)
            if new_kv is None:
                new_kv = [[k.clone(), vv.clone()] for k, vv in kv]
                logits = lg[:, -1].clone()
            else:
                for layer, (k, vv) in enumerate(kv):
                    new_kv[layer][0][rows] = k[rows]
                    new_kv[layer][1][rows] = vv[rows]
                logits[rows] = lg[rows, -1]
        return logits, new_kv

    # prefill the prompt except its last token with each row's start version
    _, caches = step_forward(prompts[:, :-1], None, 0, v_start)
    start = p - 1
    inp = prompts[:, -1:]
    for i in range(resp_len):
        ver = version_at(i)  # a row that switches at i already uses the new weights here
        logits, kv = step_forward(inp, caches, start, ver)
        caches = [
            (torch.cat([c[0], n[0]], dim=2), torch.cat([c[1], n[1]], dim=2))
            for c, n in zip(caches, kv, strict=True)
        ]  # KV entries computed with the old weights are kept after a switch
        start += 1
        lp = torch.log_softmax(logits.to(softmax_dtype), dim=-1)
        probs = lp.exp()
        ent = (-(probs.float() * lp.float()).sum(-1)).clamp_min(0.0)
        draw = torch.multinomial(probs.float(), 1, generator=gen).squeeze(-1)
        tok = torch.where(forced[:, i] >= 0, forced[:, i], draw)
        out_tok[:, i] = tok
        out_lp[:, i] = lp.float().gather(-1, tok[:, None]).squeeze(-1)
        out_h[:, i] = ent
        out_v[:, i] = ver
        inp = tok[:, None]
    return out_tok, out_lp, out_h, out_v, sampled


@torch.no_grad()
def trainer_recompute(model, seqs, lengths, micro, pad_to, order, sdpa=False):
    """fp32 log-prob / entropy of seqs[:, 1:] given the prefix; right padding with pad_to.

    sdpa=True swaps the attention kernel (torch's fused scaled_dot_product_attention)."""
    for blk in model.blocks:
        blk.use_sdpa = sdpa
    b, t = seqs.shape
    lp_out = torch.zeros(b, t - 1)
    h_out = torch.zeros(b, t - 1)
    for j in range(0, b, micro):
        rows = order[j : j + micro]
        width = int(max(lengths[r] for r in rows))
        width = int(math.ceil(width / pad_to) * pad_to)
        x = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.bool)
        for a, r in enumerate(rows):
            x[a, : lengths[r]] = seqs[r, : lengths[r]]
            mask[a, : lengths[r]] = True
        logits, _ = model(x, pad_mask=mask)
        lp, h = token_stats(logits[:, : t - 1], x[:, 1:t])
        for a, r in enumerate(rows):
            lp_out[r] = lp[a]
            h_out[r] = h[a]
    for blk in model.blocks:
        blk.use_sdpa = False
    return lp_out, h_out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--corpus-bytes", type=int, default=2_000_000)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--pretrain-steps", type=int, default=2500)
    ap.add_argument("--pretrain-batch", type=int, default=32)
    ap.add_argument("--pretrain-lr", type=float, default=3e-3)
    ap.add_argument(
        "--pretrained-cache",
        type=Path,
        default=None,
        help="file to save the pre-trained weights to, or load them from if it exists "
        "(a speed-up only: pre-training is deterministic; keep the other options unchanged)",
    )
    ap.add_argument("--rl-steps", type=int, default=16)
    ap.add_argument("--seqs-per-step", type=int, default=96)
    ap.add_argument("--group-size", type=int, default=8, help="responses per prompt")
    ap.add_argument("--prompt-len", type=int, default=24)
    ap.add_argument("--resp-len", type=int, default=104)
    ap.add_argument("--rl-lr", type=float, default=2e-5)
    ap.add_argument("--switch-prob", type=float, default=0.2)
    ap.add_argument("--tool-prob", type=float, default=0.15)
    ap.add_argument(
        "--engine-softmax",
        choices=["bf16", "fp32"],
        default="bf16",
        help="precision of the engine's softmax over its bf16 logits",
    )
    args = ap.parse_args()
    assert args.prompt_len + args.resp_len <= args.ctx

    t_start = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - t_start:6.1f}s] {msg}", flush=True)

    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    random.seed(args.seed)
    # CPU kernels are deterministic for a fixed thread count; use_deterministic_algorithms
    # would only slow training ~9x here.
    gen = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)

    raw, names = load_corpus(args.corpus_bytes)
    corpus = torch.tensor(list(raw), dtype=torch.long)
    log(
        f"corpus: {len(raw)} bytes from {len(names)} stdlib files ({names[0]} .. {names[-1]}), "
        f"python {sys.version.split()[0]}"
    )

    model = TinyLM(args.d_model, args.layers, args.heads, args.ctx)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params} parameters")
    cache = args.pretrained_cache
    if cache is not None and cache.exists():
        saved = torch.load(cache, weights_only=False)
        model.load_state_dict(saved["model"])
        gen.set_state(saved["gen"])
        final_loss = saved["loss"]
        log(f"pre-trained weights loaded from {cache}")
    else:
        final_loss = pretrain(
            model,
            corpus,
            args.pretrain_steps,
            args.pretrain_batch,
            args.ctx,
            args.pretrain_lr,
            gen,
            log,
        )
        if cache is not None:
            torch.save(
                {"model": model.state_dict(), "gen": gen.get_state(), "loss": final_loss}, cache
            )
    reference = copy.deepcopy(model).eval()

    # ------------------------------------------------------------------ async RL
    opt = torch.optim.AdamW(model.parameters(), lr=args.rl_lr, betas=(0.9, 0.95), weight_decay=0.0)
    versions = {0: copy.deepcopy(model.state_dict())}
    lag_values = np.array([0, 1, 2, 3])
    lag_probs = np.array([0.25, 0.35, 0.25, 0.15])
    line_starts = [i + 1 for i, c in enumerate(raw[: -(args.prompt_len + 1)]) if c == 10]
    rows_out: list[dict] = []
    seq_counter = 0
    switch_stats = []
    for step in range(args.rl_steps):
        train_version = step
        # --- plan the rollouts of this step (they were generated earlier, by stale engines)
        n_prompts = args.seqs_per_step // args.group_size
        starts = rng.choice(line_starts, size=n_prompts, replace=False)
        prompts = torch.stack(
            [corpus[s : s + args.prompt_len] for s in starts for _ in range(args.group_size)]
        )
        b = prompts.shape[0]
        plan, tools = [], []
        for _r in range(b):
            lag = int(min(rng.choice(lag_values, p=lag_probs), train_version))
            v0 = train_version - lag
            if lag > 0 and rng.random() < args.switch_prob / (1 - lag_probs[0]):
                v1 = int(rng.integers(v0 + 1, train_version + 1))
                pos = int(rng.integers(16, args.resp_len - 16))
                plan.append((v0, pos, v1))
            else:
                plan.append((v0, args.resp_len + 1, v0))
            if rng.random() < args.tool_prob:
                span_len = int(rng.integers(8, 25))
                s0 = int(rng.integers(8, args.resp_len - span_len))
                src = int(rng.choice(line_starts))
                toks = [c if c != EOS else 10 for c in raw[src : src + span_len]]
                tools.append((s0, toks))
            else:
                tools.append(None)
        needed = sorted({v for pl in plan for v in (pl[0], pl[2])})
        engines = {}
        for v in needed:
            eng = TinyLM(args.d_model, args.layers, args.heads, args.ctx)
            eng.load_state_dict(versions[v])
            engines[v] = eng.to(torch.bfloat16).eval()
        t_gen = time.time()
        sm_dtype = torch.bfloat16 if args.engine_softmax == "bf16" else torch.float32
        tok, infer_lp, infer_h, pver, sampled = engine_generate(
            engines, prompts, plan, args.resp_len, tools, gen, sm_dtype
        )
        t_gen = time.time() - t_gen
        # --- end of sequence: the EOS token is kept and trained on, anything after is dropped
        lengths_resp = []
        for r in range(b):
            eos = (tok[r] == EOS) & sampled[r]
            idx = torch.nonzero(eos)
            lengths_resp.append(int(idx[0]) + 1 if len(idx) else args.resp_len)
        seqs = torch.cat([prompts, tok], dim=1)
        lengths = [args.prompt_len + n for n in lengths_resp]

        # --- trainer: fp32 recompute at train_version, twice with different batch layouts
        model.eval()
        lp1, h1 = trainer_recompute(model, seqs, lengths, micro=16, pad_to=1, order=list(range(b)))
        order2 = list(rng.permutation(b))
        lp2, _ = trainer_recompute(
            model, seqs, lengths, micro=5, pad_to=32, order=order2, sdpa=True
        )
        with torch.no_grad():
            ref_lp, _ = trainer_recompute(reference, seqs, lengths, 16, 1, list(range(b)))
        p0 = args.prompt_len - 1  # column of the first response token in lp arrays
        train_lp = lp1[:, p0:]
        train_h = h1[:, p0:]
        recompute_lp = lp2[:, p0:]
        ref_resp = ref_lp[:, p0:]

        # --- loss mask: sampled (not tool) tokens before/at EOS
        loss_mask = sampled.clone()
        valid = torch.zeros(b, args.resp_len, dtype=torch.bool)
        for r in range(b):
            valid[r, : lengths_resp[r]] = True
        loss_mask &= valid
        # reward: fluency of the response under the frozen pre-trained model; group baseline
        reward = torch.stack([ref_resp[r][loss_mask[r]].mean() for r in range(b)])
        grp = reward.view(-1, args.group_size)
        adv = ((grp - grp.mean(1, keepdim=True)) / (grp.std(1, keepdim=True) + 1e-6)).view(-1)

        # --- policy-gradient update -> version train_version + 1
        model.train()
        x = seqs
        logits, _ = model(x)
        lp_all = (
            torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, x[:, 1:, None]).squeeze(-1)
        )
        lp_resp = lp_all[:, p0:]
        m = loss_mask.float()
        loss = -(adv[:, None] * lp_resp * m).sum() / m.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        versions[train_version + 1] = copy.deepcopy(model.state_dict())

        # --- rows
        d = (train_lp - infer_lp)[loss_mask]
        lm_h = infer_h[loss_mask]
        log(
            f"step {step:2d}: tokens {int(loss_mask.sum())}, reward {reward.mean():.3f}, "
            f"mean H {lm_h.mean():.3f}, H<0.05 {float((lm_h < 0.05).float().mean()):.2f}, "
            f"mean delta^2 {float((d**2).mean()):.2e}, gnorm {float(gnorm):.2f}, "
            f"versions {needed}, rollout {t_gen:.1f}s"
        )
        for r in range(b):
            n = lengths_resp[r]
            pv = pver[r, :n].clone()
            pv[~sampled[r, :n]] = -1  # tool tokens were not sampled by any policy
            ilp = infer_lp[r, :n].clone()
            ilp[~sampled[r, :n]] = 0.0  # engines report nothing for tokens they did not sample
            ih = infer_h[r, :n].clone()
            ih[~sampled[r, :n]] = 0.0
            if plan[r][1] < n:
                switch_stats.append((plan[r][0], plan[r][2], plan[r][1]))
            rows_out.append(
                dict(
                    seq_id=seq_counter,
                    step=step,
                    train_version=train_version,
                    advantage=float(adv[r]),
                    position=list(range(n)),
                    token_id=tok[r, :n].tolist(),
                    policy_version=pv.tolist(),
                    infer_logprob=ilp.numpy(),
                    entropy=ih.numpy(),
                    train_logprob=train_lp[r, :n].numpy(),
                    train_logprob_recompute=recompute_lp[r, :n].numpy(),
                    train_entropy=train_h[r, :n].numpy(),
                    loss_mask=loss_mask[r, :n].tolist(),
                )
            )
            seq_counter += 1

    write_outputs(rows_out, args.out_dir, log)
    log(f"in-flight switches: {len(switch_stats)} sequences; pretrain final loss {final_loss:.3f}")
    log(f"done in {time.time() - t_start:.0f}s")


def write_outputs(rows: list[dict], out_dir: Path, log) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    init = out_dir / "__init__.py"
    if not init.exists():
        init.write_text("")
    f32 = pa.float32()
    per_token = {
        "position": pa.int32(),
        "token_id": pa.int32(),
        "policy_version": pa.int32(),
        "train_logprob": f32,
        "train_logprob_recompute": f32,
        "infer_logprob": f32,
        "entropy": f32,
        "train_entropy": f32,
        "loss_mask": pa.bool_(),
    }
    scalars = {
        "seq_id": pa.int32(),
        "step": pa.int32(),
        "train_version": pa.int32(),
        "advantage": f32,
    }
    meta = {
        b"entr_diag.sample": b"generated by sample_data/generate_sample_run.py",
        b"entr_diag.entropy_source": b"inference",
    }
    # nested: one row per sequence
    cols = {k: pa.array([r[k] for r in rows], type=t) for k, t in scalars.items()}
    for k, t in per_token.items():
        cols[k] = pa.array([np.asarray(r[k]).tolist() for r in rows], type=pa.list_(t))
    order = ["seq_id", "step", "train_version", "advantage", *per_token]
    nested = pa.table({k: cols[k] for k in order}).replace_schema_metadata(meta)
    # long: one row per token
    lens = [len(r["position"]) for r in rows]
    long_cols = {
        k: pa.array(np.repeat([r[k] for r in rows], lens), type=t) for k, t in scalars.items()
    }
    for k, t in per_token.items():
        long_cols[k] = pa.array(np.concatenate([np.asarray(r[k]) for r in rows]), type=t)
    long_order = [
        "seq_id",
        "position",
        "step",
        "train_version",
        "policy_version",
        "token_id",
        "loss_mask",
        "train_logprob",
        "infer_logprob",
        "train_logprob_recompute",
        "entropy",
        "train_entropy",
        "advantage",
    ]
    long = pa.table({k: long_cols[k] for k in long_order}).replace_schema_metadata(meta)
    for name, table in (("sample_run_long.parquet", long), ("sample_run_nested.parquet", nested)):
        path = out_dir / name
        pq.write_table(
            table, path, compression="zstd", compression_level=19, row_group_size=1 << 20
        )
        log(
            f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}: "
            f"{table.num_rows} rows, {os.path.getsize(path)} bytes"
        )


if __name__ == "__main__":
    main()
