#!/usr/bin/env python3
"""Random-weight GGUF models of each family kvant runs, written as llama.cpp's converter writes them.

Families (GGUF architecture in brackets):
    llama3   [llama]  GQA, rope_freqs.weight (Llama-3.1 factors, computed as convert_hf_to_gguf
                      does), rope.freq_base 500000, untied output
    mistral  [llama]  GQA 4:1, rope.freq_base 1e6, untied output (llama.cpp's llama arch has no
                      sliding window, so none is written)
    qwen3    [qwen3]  attn_q_norm / attn_k_norm (per-head RMS norm before rope), key_length 64 with
                      n_head * 64 != n_embd, NEOX rope, tied output
    gemma2   [gemma2] sqrt(n_embd) embedding scale, post-attention / post-FFN norms, GeGLU (tanh
                      GELU), attn_logit_softcapping, final_logit_softcapping, sliding window on even
                      layers (llama.cpp's pattern 2), output tied to token_embd
    gemma3   [gemma3] as gemma2 without soft-capping, plus q/k norm; 6 layers of which 0..4 slide
                      (pattern 6) and 5 is global; global layers use rope.freq_base and linear rope
                      scaling, window layers rope.freq_base_swa unscaled
    phi3     [phi3]   fused attn_qkv (Q|K|V rows), fused ffn_up (gate rows then up rows), LongRoPE:
                      rope.scaling.type longrope, rope_factors_long/short.weight, attn_factor,
                      original_context_length 128 < context_length 256

Mixtures of experts (tiny: 8 experts, top 2, routers and the shared gate F32 as llama.cpp's quantize
keeps them; expert tensors stacked [n_expert][rows][cols] as ffn_{gate,up,down}_exps.weight):
    mixtral  [llama]    llama.expert_count / expert_used_count (softmax top-k, weights normalised)
    qwen2moe [qwen2moe] q/k/v biases, expert_feed_forward_length, shared expert ffn_*_shexp with
                        its sigmoid gate ffn_gate_inp_shexp, expert_shared_feed_forward_length
    qwen3moe [qwen3moe] per-head q/k norm, expert_feed_forward_length (weights normalised)
    olmoe    [olmoe]    q/k RMS norm over the whole row, experts feed_forward_length wide
    deepseek2 [deepseek2] DeepSeek-V2-Lite's layout: multi-head latent attention (plain attn_q,
                        q_lora_rank 0; attn_kv_a_mqa gives the kv_lora_rank latent, RMS-normed by
                        attn_kv_a_norm, and one rope part shared by the heads; per-head attn_k_b
                        [n_head][kv_lora][nope] and attn_v_b [n_head][v_head][kv_lora]), NORMAL
                        rope over qk_rope_head_dim; layer 0 a dense SwiGLU FFN
                        (leading_dense_block_count 1), then experts expert_feed_forward_length wide,
                        softmax gating, one ungated shared expert (expert_shared_count 1), the
                        converter's expert_group_count 1 / expert_weights_scale 1.0 (no-ops)
    deepseek3 [deepseek2] DeepSeek-V3's layout: as deepseek2 with q_lora_rank (attn_q_a,
                        attn_q_a_norm, attn_q_b), sigmoid gating, selection bias exp_probs_b,
                        2 expert groups of 4 of which 1 is kept, weights normalised and scaled by
                        2.5, YaRN rope (factor 4 over a 64-token original context,
                        yarn_log_multiplier 0.0707 as V3's converter writes 0.1 * mscale_all_dim)
    gpt-oss  [gpt-oss]  llama.cpp's openai-moe: q/k/v and attn_output biases, attn_sinks (per head a
                        logit that joins the softmax without a value), sliding window on even layers
                        (llama.cpp's pattern 2; no pattern key, as the converter writes none), YaRN
                        (factor 4 over a 64-token original context; the converter's yarn_beta_fast /
                        yarn_beta_slow 32 / 1), key_length and no rope.dimension_count (llama.cpp
                        takes key_length); post_attention_norm is the FFN's input norm (no
                        ffn_norm); router bias ffn_gate_inp.bias, experts chosen on the router logits
                        and weighted by a softmax over the chosen; expert biases
                        ffn_{gate,up,down}_exps.bias [n_expert][rows]; swiglu_oai (gate clamped above
                        at 7, up to [-7, 7]: g sigmoid(1.702 g) (up + 1)); feed_forward_length
                        and expert_feed_forward_length both the experts' width (intermediate_size)

Hybrids (recurrent + attention; HYBRID_FAMILIES, in FAMILIES; the reference's own checks are
tests/py/test_hybrid_ref.py, kvant's serving of them tests/py/test_hybrid.py).  A layer is recurrent where the
per-layer attention.head_count_kv array is 0 (nemotron-h: and feed_forward_length 0; qwen35: where
attention.recurrent_layers says so; lfm2 and granite-h tiny: attention at layers 2 and 5 of 6):
    lfm2      [lfm2]   LFM2: a gated short convolution (shortconv.l_cache 3 taps) in the recurrent
                       layers: shortconv.in_proj gives b | c | x, y = c * conv(b * x) (per channel,
                       the l_cache - 1 previous b*x rows as state), shortconv.out_proj y;
                       shortconv.conv.weight [n_embd][l_cache] F32; attention layers with per-head
                       q/k RMS norm before NEOX rope; attn_norm is the "operator norm" of both kinds;
                       token_embd_norm.weight is the OUTPUT norm (llama.cpp's name); tied output
    granite-h [granitehybrid] Granite-4.0-H: Mamba-2 recurrent layers (ssm.inner_size 2 n_embd in
                       ssm.time_step_rank heads, ssm.group_count groups of B and C ssm.state_size
                       wide; ssm_in rows z | x B C | dt, a ssm.conv_kernel-tap convolution with bias
                       over x B C, dt = softplus(dt + ssm_dt.bias), A = ssm_a (-exp(A_log)), skip
                       ssm_d, y * silu(z), an RMS norm per group (ssm_norm [group][d_inner/group]),
                       ssm_out); attention layers without rope (rope.scaling.finetuned false: NoPE);
                       embedding_scale, residual_scale (both branches), attention.scale (1/head_dim,
                       q/k rows scaled so that scores stay O(1)), logit_scale (logits divided by it;
                       output.weight scaled up by it); untied output.  The tiny shape has 2 groups of
                       B/C (the real models 1).  context_length is the shape's (the converter writes
                       2**20 for a NoPE model; a small one keeps default contexts small).
    nemotron-h [nemotron_h] Nemotron-H / Nemotron-Nano-2 (dense, not nemotron_h_moe): every layer is ONE
                       sublayer behind its attn_norm, from the config's hybrid_override_pattern
                       (tiny "M-*M-M*-"): "M" a Mamba-2 mixer (granite-h's tensors and maths, but
                       ssm.inner_size = mamba_num_heads * mamba_head_dim: tiny 8 heads of 32 = n_embd),
                       "*" attention without rope (llama.cpp's rope type NONE for the architecture;
                       attn_q/k/v/output, no biases, no q/k norm, scale 1/sqrt(key_length)), "-" an
                       ungated MLP ffn_down(relu(ffn_up h)^2).  Keys as NemotronHModel (via
                       GraniteHybridModel, GraniteMoeModel, GraniteModel, LlamaModel, TextModel) writes
                       them: per-layer attention.head_count_kv (n_head_kv on "*", 0 on "M" and "-") and
                       feed_forward_length (n_ff on "-", 0 on the others): llama.cpp's layer is recurrent
                       where both are 0; key_length / value_length head_dim; rope.dimension_count
                       n_embd / n_head (LlamaModel's, GraniteModel having popped head_dim; tiny 32 with
                       key_length 64, as Nemotron-Nano-9B-v2's 112 with 128); attention.layer_norm_epsilon
                       only (the config's layer_norm_epsilon; llama.cpp falls back to it for the RMS
                       eps); ssm.conv_kernel / inner_size / state_size / time_step_rank (SSM heads) /
                       group_count; rope.scaling.finetuned false; no rope.freq_base (no rope_theta in
                       the config), no granite multipliers, no expert keys; output_norm, untied output.
                       context_length the shape's, as granite-h (the converter writes 2**20).
    qwen35    [qwen35] Qwen3.5, dense (not qwen35moe / qwen3next): Gated DeltaNet (GDN) layers and gated
                       full-attention layers, full attention every full_attention_interval-th layer
                       (tiny: 8 layers, attention at 3 and 7).  Keys as Qwen3_5TextModel (via
                       _Qwen35MRopeMixin, _LinearAttentionVReorderBase, Qwen3NextModel, Qwen2MoeModel,
                       TextModel) writes them for a config with layer_types and no MTP block (as
                       convert_hf_to_gguf.py --no-mtp writes it): scalar head_count_kv; key_length /
                       value_length head_dim; rope.dimension_count head_dim / 4 (partial_rotary_factor
                       0.25); rope.dimension_sections, the interleaved M-RoPE sections padded to 4
                       ([11, 11, 10, 0] over Qwen3.5's 32 rotated pairs; tiny [3, 3, 2, 0] over 8);
                       rope.freq_base 1e7; attention.layer_norm_rms_epsilon 1e-6; ssm.conv_kernel,
                       ssm.state_size (linear_key_head_dim), ssm.group_count (K heads),
                       ssm.time_step_rank (V heads), ssm.inner_size (V heads * linear_value_head_dim;
                       llama.cpp needs head_v_dim = head_k_dim = state_size); attention.recurrent_layers
                       (bool per layer) and full_attention_interval 4; tied output (as Qwen3.5-0.8B /
                       2B).  Every layer: attn_norm, post_attention_norm (the FFN's input norm),
                       ffn_gate / up / down.  Attention layers: attn_q [n_head * 2 head_dim] (per head
                       q then its output gate), attn_k, attn_v, attn_output, attn_q_norm / attn_k_norm
                       [head_dim].  GDN layers: attn_qkv (rows q | k | v: K heads, K heads, V heads of
                       state_size), attn_gate (z, [inner_size]), ssm_conv1d [q|k|v channels][conv_kernel]
                       (no bias), ssm_dt.bias [V heads], ssm_a [V heads] (-exp(A_log)), ssm_beta /
                       ssm_alpha [V heads][n_embd] (matrices: the weight type), ssm_norm [state_size],
                       ssm_out.  V heads in the converter's tiled order: V head h reads K head
                       h % (K heads).  Tiny: 2 K heads and 4 V heads of 64.
    The recurrent layers' small tensors (ssm_a, ssm_d, ssm_dt.bias, ssm_conv1d.bias, ssm_norm) and the
    convolution weights (ggml_ssm_conv reads F32 only; llama.cpp's quantize skips ssm_conv1d and
    shortconv.conv) stay F32.  dt biases and A give dA = exp(dt A) of median 0.7, 0.13..0.98 between
    its 1st and 99th percentiles (tiny), so the state both persists and decays.

Norm weights are stored as llama.cpp's graph uses them (Gemma's converter has already added the +1).
Shapes: "tiny" (n_embd 256, vocab 384, window 8: fast, yet every layer kind, GQA and a window smaller
than the tests' sequences), "1b" (about 1e9 parameters, for speed runs; slow to write; lfm2 as
LFM2-1.2B: 16 layers of 2048, attention at 2 5 8 10 12 14, 32 / 8 heads, n_ff 8192; granite-h as
Granite-4.0-H-1B: 40 layers of 1536, attention at 9 18 27 36, 12 / 4 heads, n_ff 4096, 48 SSM
heads of 64, d_state 128, 1 group; nemotron-h Nemotron-Nano-like, 8.5e8 parameters: 28 layers of
2048 "M-M-M*-M-M-M*-M-M*-M-M-M*-M-", 16 / 8 heads of 128, MLPs 6144 wide, 64 SSM heads of 64, d_state
128, 8 groups; qwen35 Qwen3.5-2B-like, 1.4e9 parameters, tied: 24 layers of 2048, attention at
3 7 .. 23 (8 / 2 heads of 256, rope over 64 dims), n_ff 6144, 16 K and 16 V GDN heads of 128),
"7b" (olmoe only: OLMoE-1B-7B's 64 experts, 8 per token, 6.8e9 parameters; the MoE speed runs) or
"long" (gemma2/gemma3 only: Gemma-3-shaped layers, 5 window + 1 global, window 1024, context 32768,
but n_embd 64 and one KV head: the 32k sliding-window KV measurement, cheap on two cores).
Weight types: those of make_synthetic (F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K) for the
2-D matrices and deepseek2's 3-D attn_k_b / attn_v_b; norms, rope factors stay F32; token_embd takes
the weight type too.  A matrix whose rows do not split into the type's blocks takes llama.cpp
quantize's fallback (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, F16 when 32 does not divide them).

    python tests/py/make_family.py OUTDIR FAMILY [--wtype T] [--shape tiny|1b] [--seed N]
    (FAMILY "all": every family of FAMILIES the shape has, not the hybrids)
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import zlib
from dataclasses import dataclass, replace

import numpy as np
from gguf import GGUFWriter

import make_synthetic as ms

DENSE_FAMILIES = ["llama3", "mistral", "qwen3", "gemma2", "gemma3", "phi3"]
MOE_FAMILIES = ["mixtral", "qwen2moe", "qwen3moe", "olmoe", "deepseek2", "deepseek3", "gpt-oss"]
HYBRID_FAMILIES = ["lfm2", "granite-h", "nemotron-h", "qwen35"]
FAMILIES = DENSE_FAMILIES + MOE_FAMILIES + HYBRID_FAMILIES
ARCH = {"llama3": "llama", "mistral": "llama", "qwen3": "qwen3", "gemma2": "gemma2",
        "gemma3": "gemma3", "phi3": "phi3", "mixtral": "llama", "qwen2moe": "qwen2moe",
        "qwen3moe": "qwen3moe", "olmoe": "olmoe", "deepseek2": "deepseek2", "deepseek3": "deepseek2",
        "gpt-oss": "gpt-oss", "deepseek2-lite": "deepseek2", "lfm2": "lfm2", "granite-h": "granitehybrid",
        "nemotron-h": "nemotron_h", "qwen35": "qwen35"}
# deepseek2-lite (not in FAMILIES): DeepSeek-V2-Lite's KV shape (27 layers, kv_lora_rank 512, rope 64,
# heads 128 + 64 / 128 wide) at n_embd 64 with 2 heads and 4 small experts: the latent KV memory test
# (the cache row does not depend on the head count); tests/py/test_mla.py


@dataclass(frozen=True)
class Moe:
    n_expert: int
    n_used: int
    n_ff_exp: int    # expert_feed_forward_length (qwen2moe, qwen3moe; mixtral and olmoe experts are
                     # feed_forward_length wide)
    n_ff_shexp: int  # 0: no shared expert
    shexp_gate: bool = True   # ffn_gate_inp_shexp scales the shared expert (deepseek2's is ungated)
    # deepseek2's routing keys, written where set (as its converter does)
    n_dense_lead: int = 0              # leading_dense_block_count: layers 0..n-1 have a dense FFN
    gating: int = 0                    # expert_gating_func: 1 softmax, 2 sigmoid
    groups: tuple[int, int] = (0, 0)   # expert_group_count, expert_group_used_count
    norm_w: bool = False               # expert_weights_norm (the converter writes it only when true)
    scale: float = 0.0                 # expert_weights_scale
    probs_bias: bool = False           # blk.N.exp_probs_b.bias: added to the probabilities to select
    oai: bool = False   # gpt-oss: router bias, expert biases, gate/up rows reaching swiglu_oai's clamp


MOE = {"mixtral": Moe(8, 2, 0, 0), "qwen2moe": Moe(8, 2, 256, 512), "qwen3moe": Moe(8, 2, 256, 0),
       "olmoe": Moe(8, 2, 0, 0),
       "deepseek2": Moe(8, 2, 128, 128, shexp_gate=False, n_dense_lead=1, gating=1, groups=(1, 1),
                        scale=1.0),
       "deepseek3": Moe(8, 2, 128, 128, shexp_gate=False, n_dense_lead=1, gating=2, groups=(2, 1),
                        norm_w=True, scale=2.5, probs_bias=True),
       "gpt-oss": Moe(8, 2, 128, 0, oai=True),
       "deepseek2-lite": Moe(4, 2, 32, 32, shexp_gate=False, n_dense_lead=1, gating=1)}


@dataclass(frozen=True)
class Mla:
    """deepseek2's multi-head latent attention: every head's K and V decompress from one latent row
    of kv_lora values per token; the heads share one rope part of `rope` values."""
    q_lora: int   # attention.q_lora_rank; 0: a plain attn_q
    kv_lora: int  # attention.kv_lora_rank
    nope: int     # a head's K columns without rope (qk_nope_head_dim)
    rope: int     # rope.dimension_count (qk_rope_head_dim)
    v_head: int   # attention.value_length_mla
    yarn: tuple[float, int, float] | None = None   # YaRN factor, original context, yarn_log_multiplier


# deepseek3: YaRN as V3 has it (factor 40 over 4096 there), here factor 4 over a 64-token original
# context so the tests' 256-token sequences reach the scaled range; groups of 4 experts keep 1 of 2
# (a group's score is the sum of its best two, not of all four)
MLA = {"deepseek2": Mla(0, 128, 64, 32, 64),
       "deepseek3": Mla(96, 128, 64, 32, 64, yarn=(4.0, 64, 0.0707)),
       "deepseek2-lite": Mla(0, 512, 128, 64, 128)}
# gpt-oss: YaRN factor and original context (32 over 4096 in the real model; here as deepseek3's so
# that the tests' sequences reach the scaled range), and the beta_fast / beta_slow its config gives
GPT_OSS_YARN = (4.0, 64)
GPT_OSS_BETAS = (32.0, 1.0)


@dataclass(frozen=True)
class Recr:
    """A hybrid's recurrent layers: every layer not in attn (head_count_kv 0 there) nor in mlp.  lfm2:
    d_conv is shortconv.l_cache, the taps of its convolution over n_embd channels; granite-h: Mamba-2
    with d_inner = 2 n_embd in n_head heads, n_group groups of B and C d_state wide, d_conv taps;
    nemotron-h: the same Mamba-2 with d_inner = n_head * head_dim (any multiple of the heads), and
    mlp the layers that are an MLP alone (head_count_kv 0, feed_forward_length n_ff); qwen35: Gated
    DeltaNet with n_head V heads and n_group K heads, all head_dim = d_state wide."""
    attn: tuple[int, ...]
    d_conv: int
    d_state: int = 0
    n_head: int = 0
    n_group: int = 0
    head_dim: int = 0            # an SSM head's width; 0: 2 n_embd / n_head (granite-h)
    mlp: tuple[int, ...] = ()    # nemotron-h's MLP layers

    def d_inner(self, n_embd: int) -> int:
        return self.n_head * self.head_dim if self.head_dim else 2 * n_embd


def nemotron_recr(pattern: str, d_state: int, n_head: int, head_dim: int, n_group: int) -> Recr:
    """Nemotron-H's layers from its hybrid_override_pattern, one character a layer: "M" a Mamba-2
    mixer, "*" attention, "-" an MLP (as NemotronHModel reads it)."""
    assert set(pattern) <= set("M*-"), pattern
    return Recr(tuple(i for i, c in enumerate(pattern) if c == "*"), 4, d_state=d_state,
                n_head=n_head, n_group=n_group, head_dim=head_dim,
                mlp=tuple(i for i, c in enumerate(pattern) if c == "-"))


# nemotron-h's hybrid_override_pattern: tiny, and the 1b shape's 28 layers (12 M, 12 -, 4 *, the
# mixers mostly followed by an MLP as in Nemotron-Nano-9B-v2's "M-M-M-MM-M-M-M*-M-...")
NEMOTRON_TINY = "M-*M-M*-"
NEMOTRON_1B = "M-M-M*-M-M-M*-M-M*-M-M-M*-M-"


# granite-h's multipliers (Granite-4.0-H's: embedding 12, residual 0.22, logits 6; attention.scale
# is 1/head_dim, its attention_multiplier 0.0078125 at head_dim 128)
GRANITE_SCALES = {"embedding_scale": 12.0, "residual_scale": 0.22, "logit_scale": 6.0}


@dataclass(frozen=True)
class Shape:
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_layer: int
    n_vocab: int
    n_ctx: int
    window: int
    n_expert: int = 0   # > 0: the family's expert count and experts per token, overridden
    n_used: int = 0
    recr: Recr | None = None   # the hybrids' recurrent layers


def moe_of(fam: str, sh: Shape) -> Moe:
    """The family's experts, with the shape's counts where it sets them."""
    mo = MOE[fam]
    return replace(mo, n_expert=sh.n_expert or mo.n_expert, n_used=sh.n_used or mo.n_used)


TINY = {
    "llama3": Shape(256, 512, 4, 2, 64, 2, ms.N_VOCAB, 256, 0),
    "mistral": Shape(256, 512, 8, 2, 32, 2, ms.N_VOCAB, 256, 0),
    "qwen3": Shape(256, 512, 8, 2, 64, 2, ms.N_VOCAB, 256, 0),
    "gemma2": Shape(256, 512, 4, 2, 64, 4, ms.N_VOCAB, 256, 8),
    "gemma3": Shape(256, 512, 4, 2, 64, 6, ms.N_VOCAB, 256, 8),
    "phi3": Shape(256, 512, 4, 2, 64, 2, ms.N_VOCAB, 256, 0),
    "mixtral": Shape(256, 512, 8, 2, 32, 2, ms.N_VOCAB, 256, 0),
    "qwen2moe": Shape(256, 1024, 4, 4, 64, 2, ms.N_VOCAB, 256, 0),
    "qwen3moe": Shape(256, 1024, 8, 2, 64, 2, ms.N_VOCAB, 256, 0),
    "olmoe": Shape(256, 512, 4, 4, 64, 2, ms.N_VOCAB, 256, 0),
    # head_dim: key_length_mla (nope + rope); n_ff: the dense layer's width
    "deepseek2": Shape(256, 512, 4, 1, 96, 3, ms.N_VOCAB, 256, 0),
    "deepseek3": Shape(256, 512, 4, 1, 96, 3, ms.N_VOCAB, 256, 0),
    # n_ff: feed_forward_length, which gpt-oss's converter sets to the experts' width too
    "gpt-oss": Shape(256, 128, 4, 2, 64, 2, ms.N_VOCAB, 256, 8),
    "deepseek2-lite": Shape(64, 64, 2, 1, 192, 27, ms.N_VOCAB, 2048, 0),
    # hybrids: layers 0 1 3 4 recurrent, 2 and 5 attention; granite-h: 8 SSM heads of 64, 2 groups
    "lfm2": Shape(256, 512, 4, 2, 64, 6, ms.N_VOCAB, 256, 0, recr=Recr((2, 5), 3)),
    "granite-h": Shape(256, 512, 4, 2, 64, 6, ms.N_VOCAB, 256, 0,
                       recr=Recr((2, 5), 4, d_state=16, n_head=8, n_group=2)),
    # nemotron-h: 8 layers M - * M - M * -; 8 attention heads of 64 (n_head * head_dim = 512 !=
    # n_embd, so rope.dimension_count n_embd / n_head = 32 != key_length as in Nemotron-Nano-9B-v2's
    # 112 vs 128); 8 SSM heads of 32 (d_inner 256 = n_embd, not 2 n_embd), 2 groups of 16
    "nemotron-h": Shape(256, 512, 8, 2, 64, 8, ms.N_VOCAB, 256, 0,
                        recr=nemotron_recr(NEMOTRON_TINY, d_state=16, n_head=8, head_dim=32, n_group=2)),
    # qwen35: layers 3 and 7 gated attention (4 / 2 heads of 64, rope over 16 of them), the others
    # Gated DeltaNet with 2 K heads and 4 V heads of 64 (d_inner 256)
    "qwen35": Shape(256, 512, 4, 2, 64, 8, ms.N_VOCAB, 256, 0,
                    recr=Recr((3, 7), 4, d_state=64, n_head=4, n_group=2, head_dim=64)),
}
# ~1e9 parameters each (embedding included); vocabularies stay small-ish to keep the files lean
BIG = {
    "llama3": Shape(2048, 8192, 32, 8, 64, 16, 32768, 4096, 0),
    "mistral": Shape(2048, 7168, 16, 4, 128, 18, 32768, 4096, 0),
    "qwen3": Shape(2048, 6144, 16, 8, 128, 20, 32768, 4096, 0),
    "gemma2": Shape(2048, 8192, 8, 4, 256, 16, 32768, 4096, 512),
    "gemma3": Shape(1536, 6912, 8, 2, 256, 24, 32768, 4096, 512),
    "phi3": Shape(2048, 8192, 32, 8, 64, 16, 32768, 4096, 0),
    "mixtral": Shape(1024, 1024, 16, 4, 64, 8, 32768, 4096, 0),
    "qwen2moe": Shape(1024, 2048, 16, 16, 64, 8, 32768, 4096, 0),
    "qwen3moe": Shape(1024, 2048, 16, 4, 64, 8, 32768, 4096, 0),
    "olmoe": Shape(1024, 1024, 16, 16, 64, 8, 32768, 4096, 0),
    # LFM2-1.2B's layers (1.1e9 parameters here) and Granite-4.0-H-1B's (1.4e9, untied output)
    "lfm2": Shape(2048, 8192, 32, 8, 64, 16, 32768, 4096, 0, recr=Recr((2, 5, 8, 10, 12, 14), 3)),
    "granite-h": Shape(1536, 4096, 12, 4, 128, 40, 32768, 4096, 0,
                       recr=Recr((9, 18, 27, 36), 4, d_state=128, n_head=48, n_group=1)),
    # Nemotron-Nano-like (0.85e9 parameters, untied output): 28 layers of 2048, attention at
    # 5 12 17 24 (16 / 8 heads of 128), MLPs 6144 wide, 64 SSM heads of 64 (d_inner 4096),
    # d_state 128, 8 groups
    "nemotron-h": Shape(2048, 6144, 16, 8, 128, 28, 32768, 4096, 0,
                        recr=nemotron_recr(NEMOTRON_1B, d_state=128, n_head=64, head_dim=64, n_group=8)),
    # Qwen3.5-2B's layers (1.4e9 parameters here, tied output): 24 layers of 2048, attention every
    # 4th (8 / 2 heads of 256), n_ff 6144, Gated DeltaNet with 16 K and 16 V heads of 128
    "qwen35": Shape(2048, 6144, 8, 2, 256, 24, 32768, 4096, 0,
                    recr=Recr(tuple(range(3, 24, 4)), 4, d_state=128, n_head=16, n_group=16, head_dim=128)),
}

# 32k context at a tiny width: the window-group memory test (tests/py/test_kv_window.py)
LONG = {
    "gemma3": Shape(64, 128, 2, 1, 32, 6, ms.N_VOCAB, 32768, 1024),
    "gemma2": Shape(64, 128, 2, 1, 32, 2, ms.N_VOCAB, 32768, 1024),
}
# OLMoE-1B-7B's shape (64 experts of 1024, 8 per token, 16 layers of 2048): the MoE speed runs
# (bench/moe.py); vocabulary 32768 instead of 50304 to keep the file lean
OLMOE7B = {"olmoe": Shape(2048, 1024, 16, 16, 128, 16, 32768, 4096, 0, n_expert=64, n_used=8)}
SHAPES = {"tiny": TINY, "1b": BIG, "long": LONG, "7b": OLMOE7B}

PHI3_ORIG_CTX = 128   # tiny: original_context_length < context_length, so LongRoPE has both sets


def llama3_rope_factors(base: float, dim: int, factor=8.0, low=1.0, high=4.0, old_ctx=8192) -> np.ndarray:
    """rope_freqs.weight as convert_hf_to_gguf computes it for rope_type llama3."""
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    lo_w, hi_w = old_ctx / low, old_ctx / high
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < hi_w:
            out.append(1.0)
        elif wl > lo_w:
            out.append(factor)
        else:
            s = (old_ctx / wl - low) / (high - low)
            out.append(1.0 / ((1 - s) / factor + s))
    return np.asarray(out, dtype=np.float32)


# llama.cpp gives a vocabulary whose general.name contains "phi3" rules for these tokens
# and fails to load one that lacks them, as a real Phi-3 vocabulary never does.
PHI3_SPECIAL = ["<unk>", "<s>", "</s>", "<|endoftext|>"]


def _vocab(n_vocab: int, fam: str):
    tokens, types, merges, bos, eos = ms.tokenizer_vocab()
    while len(tokens) < n_vocab:
        tokens.append(f"<|tok_{len(tokens)}|>")
        types.append(3)
    tokens, types = tokens[:n_vocab], types[:n_vocab]
    if fam == "phi3":
        tokens[n_vocab - len(PHI3_SPECIAL):] = PHI3_SPECIAL
    return tokens, types, merges, bos, eos


QWEN35_FREQ_BASE = 1e7   # Qwen3.5's rope_theta
QWEN35_ATTN_INTERVAL = 4   # full_attention_interval


def qwen35_sections(n_rot: int) -> list[int]:
    """Qwen3.5's interleaved M-RoPE sections for n_rot rotated dims, padded to 4 as the converter
    writes them: [11, 11, 10, 0] for its 64 (32 pairs); the same split of n_rot / 2 pairs otherwise
    (every pair in a text section: none takes the 4th position, which is 0 for text tokens)."""
    pairs = n_rot // 2
    a = (pairs + 2) // 3
    return [a, a, pairs - 2 * a, 0]


def _qwen35_header(w: GGUFWriter, sh: Shape) -> None:
    """qwen35's keys, as Qwen3_5TextModel writes them (TextModel's, then Qwen3NextModel's, in that
    order): head_count_kv a scalar (llama.cpp takes the recurrent layers from
    attention.recurrent_layers, else full_attention_interval); rope.dimension_count head_dim *
    partial_rotary_factor 0.25."""
    arch, r = w.arch, sh.recr
    w.add_context_length(sh.n_ctx)
    w.add_embedding_length(sh.n_embd)
    w.add_feed_forward_length(sh.n_ff)
    w.add_head_count(sh.n_head)
    w.add_head_count_kv(sh.n_head_kv)
    n_rot = sh.head_dim // 4
    w.add_rope_dimension_sections(qwen35_sections(n_rot))
    w.add_rope_freq_base(QWEN35_FREQ_BASE)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(sh.head_dim)
    w.add_value_length(sh.head_dim)
    assert r.head_dim == r.d_state, "llama.cpp's qwen35 needs head_v_dim = head_k_dim = ssm.state_size"
    w.add_uint32(f"{arch}.ssm.conv_kernel", r.d_conv)
    w.add_uint32(f"{arch}.ssm.state_size", r.d_state)
    w.add_uint32(f"{arch}.ssm.group_count", r.n_group)
    w.add_uint32(f"{arch}.ssm.time_step_rank", r.n_head)
    w.add_uint32(f"{arch}.ssm.inner_size", r.d_inner(sh.n_embd))
    recurrent = [L not in r.attn for L in range(sh.n_layer)]
    assert recurrent == [(L + 1) % QWEN35_ATTN_INTERVAL != 0 for L in range(sh.n_layer)]
    w.add_array(f"{arch}.attention.recurrent_layers", recurrent)
    w.add_uint32(f"{arch}.full_attention_interval", QWEN35_ATTN_INTERVAL)
    w.add_rope_dimension_count(n_rot)


def _header(w: GGUFWriter, fam: str, sh: Shape, name: str):
    arch = ARCH[fam]
    w.add_name(name)
    if fam == "qwen35":
        w.add_block_count(sh.n_layer)
        _qwen35_header(w, sh)
        w.add_vocab_size(sh.n_vocab)
        ms.add_tokenizer(w, *_vocab(sh.n_vocab, fam))
        return QWEN35_FREQ_BASE
    w.add_context_length(sh.n_ctx)
    w.add_embedding_length(sh.n_embd)
    if fam == "nemotron-h":   # per layer: n_ff on the MLP layers, 0 on the mixers and attention
        w.add_feed_forward_length([sh.n_ff if L in sh.recr.mlp else 0 for L in range(sh.n_layer)])
    else:
        w.add_feed_forward_length(sh.n_ff)
    w.add_block_count(sh.n_layer)
    w.add_head_count(sh.n_head)
    if sh.recr:   # the converters' per-layer array: 0 marks a recurrent layer (nemotron-h: or an MLP)
        w.add_head_count_kv([sh.n_head_kv if L in sh.recr.attn else 0 for L in range(sh.n_layer)])
    else:
        w.add_head_count_kv(sh.n_head_kv)
    if fam == "nemotron-h":   # its config's layer_norm_epsilon (no rms_norm_eps): the only eps key
        w.add_layer_norm_eps(1e-5)
    else:
        w.add_layer_norm_rms_eps(1e-6 if fam.startswith(("gemma", "qwen3", "deepseek")) else 1e-5)
    if fam in MOE:
        mo = moe_of(fam, sh)
        w.add_expert_count(mo.n_expert)
        w.add_expert_used_count(mo.n_used)
        if mo.n_ff_exp:
            w.add_expert_feed_forward_length(mo.n_ff_exp)
        if arch == "deepseek2":
            _deepseek2_routing(w, mo)
        elif mo.n_ff_shexp:
            w.add_expert_shared_feed_forward_length(mo.n_ff_shexp)
    if fam in MLA:
        _mla_keys(w, MLA[fam])
    elif fam == "nemotron-h":
        # LlamaModel's rope.dimension_count from hidden_size / num_attention_heads (GraniteModel has
        # popped head_dim; llama.cpp ignores it: nemotron_h has no rope), NemotronHModel's
        # key_length / value_length head_dim
        w.add_rope_dimension_count(sh.n_embd // sh.n_head)
        w.add_key_length(sh.head_dim)
        w.add_value_length(sh.head_dim)
    else:
        if fam in ("qwen3", "qwen3moe", "gemma2", "gemma3", "gpt-oss") or \
                sh.n_head * sh.head_dim != sh.n_embd:
            w.add_key_length(sh.head_dim)
            w.add_value_length(sh.head_dim)
        if fam not in ("gpt-oss", "lfm2"):   # their converters write none: llama.cpp rotates
            w.add_rope_dimension_count(sh.head_dim)   # key_length (or n_embd / n_head) dims
    if fam == "nemotron-h":   # no rope_theta in its config: no rope.freq_base
        _hybrid_keys(w, fam, sh)
        w.add_vocab_size(sh.n_vocab)
        ms.add_tokenizer(w, *_vocab(sh.n_vocab, fam))
        return 10000.0
    base = {"llama3": 500000.0, "mistral": 1e6, "qwen3": 1e6, "gemma2": 10000.0,
            "gemma3": 1e6, "phi3": 10000.0, "mixtral": 1e6, "qwen2moe": 1e6, "qwen3moe": 1e6,
            "olmoe": 10000.0, "deepseek2": 10000.0, "deepseek3": 10000.0,
            "gpt-oss": 150000.0, "deepseek2-lite": 10000.0, "lfm2": 1e6, "granite-h": 10000.0}[fam]
    w.add_rope_freq_base(base)
    if fam == "gemma2":
        tiny = sh.n_embd <= 256
        w.add_float32(f"{arch}.attn_logit_softcapping", 4.0 if tiny else 50.0)
        w.add_float32(f"{arch}.final_logit_softcapping", 6.0 if tiny else 30.0)
        w.add_uint32(f"{arch}.attention.sliding_window", sh.window)
    if fam == "gemma3":
        w.add_uint32(f"{arch}.attention.sliding_window", sh.window)
        w.add_float32(f"{arch}.rope.freq_base_swa", 10000.0)
        if sh.n_embd <= 256:   # linear scaling of the global layers (Gemma-3 4B and larger have 8)
            w.add_string(f"{arch}.rope.scaling.type", "linear")
            w.add_float32(f"{arch}.rope.scaling.factor", 2.0)
    if fam == "phi3":
        orig = PHI3_ORIG_CTX if sh.n_embd <= 256 else sh.n_ctx // 2
        w.add_uint32(f"{arch}.rope.scaling.original_context_length", orig)
        w.add_string(f"{arch}.rope.scaling.type", "longrope")
        scale = sh.n_ctx / orig
        w.add_float32(f"{arch}.rope.scaling.attn_factor", math.sqrt(1 + math.log(scale) / math.log(orig)))
        w.add_uint32(f"{arch}.attention.sliding_window", 0)
    if fam == "gpt-oss":
        _yarn_keys(w, *GPT_OSS_YARN)
        w.add_float32(f"{arch}.rope.scaling.yarn_beta_fast", GPT_OSS_BETAS[0])
        w.add_float32(f"{arch}.rope.scaling.yarn_beta_slow", GPT_OSS_BETAS[1])
        w.add_uint32(f"{arch}.attention.sliding_window", sh.window)
    if sh.recr:
        _hybrid_keys(w, fam, sh)
    w.add_vocab_size(sh.n_vocab)
    ms.add_tokenizer(w, *_vocab(sh.n_vocab, fam))
    return base


def _hybrid_keys(w: GGUFWriter, fam: str, sh: Shape) -> None:
    """lfm2's shortconv.l_cache; granite-h's multipliers, Mamba-2 sizes and the rope switch, as
    GraniteHybridModel writes them (ssm.time_step_rank is the SSM head count; the dense FFN is the
    config's shared MLP, so expert_shared_feed_forward_length is written as well)."""
    arch, r = w.arch, sh.recr
    if fam == "lfm2":
        w.add_uint32(f"{arch}.shortconv.l_cache", r.d_conv)
        return
    if fam == "granite-h":   # Nemotron-H's config has no multipliers nor shared_intermediate_size
        w.add_float32(f"{arch}.attention.scale", 1.0 / sh.head_dim)
        for k, v in GRANITE_SCALES.items():
            w.add_float32(f"{arch}.{k}", v)
        w.add_uint32(f"{arch}.expert_shared_feed_forward_length", sh.n_ff)
    w.add_uint32(f"{arch}.ssm.conv_kernel", r.d_conv)
    w.add_uint32(f"{arch}.ssm.state_size", r.d_state)
    w.add_uint32(f"{arch}.ssm.group_count", r.n_group)
    # granitehybrid: llama.cpp asserts 2 n_embd; nemotron-h: mamba_num_heads * mamba_head_dim
    w.add_uint32(f"{arch}.ssm.inner_size", r.d_inner(sh.n_embd))
    w.add_uint32(f"{arch}.ssm.time_step_rank", r.n_head)
    w.add_bool(f"{arch}.rope.scaling.finetuned", False)     # no rope (a model with SSM layers)


def _deepseek2_routing(w: GGUFWriter, mo: Moe) -> None:
    """The keys deepseek2's converter writes for routing (the shared expert is
    expert_shared_count experts expert_feed_forward_length wide)."""
    arch = w.arch
    w.add_leading_dense_block_count(mo.n_dense_lead)
    w.add_expert_shared_count(mo.n_ff_shexp // mo.n_ff_exp)
    w.add_expert_weights_scale(mo.scale)
    if mo.norm_w:
        w.add_expert_weights_norm(True)
    w.add_uint32(f"{arch}.expert_group_count", mo.groups[0])
    w.add_uint32(f"{arch}.expert_group_used_count", mo.groups[1])
    w.add_uint32(f"{arch}.expert_gating_func", mo.gating)


def _mla_keys(w: GGUFWriter, mla: Mla) -> None:
    """key_length / value_length are the absorbed form's (the latent plus the rope part); the _mla
    pair are a decompressed head's."""
    w.add_q_lora_rank(mla.q_lora)   # llama.cpp reads it unless the model has 26 or 27 layers
    w.add_kv_lora_rank(mla.kv_lora)
    w.add_key_length(mla.kv_lora + mla.rope)
    w.add_value_length(mla.kv_lora)
    w.add_key_length_mla(mla.nope + mla.rope)
    w.add_value_length_mla(mla.v_head)
    w.add_rope_dimension_count(mla.rope)
    if mla.yarn:
        _yarn_keys(w, *mla.yarn[:2])
        w.add_float32(f"{w.arch}.rope.scaling.yarn_log_multiplier", mla.yarn[2])


def _yarn_keys(w: GGUFWriter, factor: float, orig_ctx: int) -> None:
    """The YaRN keys every converter writes (TextModel's rope_type "yarn")."""
    w.add_string(f"{w.arch}.rope.scaling.type", "yarn")
    w.add_float32(f"{w.arch}.rope.scaling.factor", factor)
    w.add_uint32(f"{w.arch}.rope.scaling.original_context_length", orig_ctx)


def _fit_type(t: str, cols: int) -> str:
    """The type llama.cpp's quantize gives a matrix of `cols` columns asked to be t
    (tensor_type_fallback)."""
    if t in ("Q4_K", "Q5_K", "Q6_K") and cols % 256:
        t = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}[t]
    if t not in ("F32", "F16", "BF16") and cols % 32:
        t = "F16"
    return t


def _add3(w: GGUFWriter, rng, name: str, n: int, rows: int, cols: int, std: float, wtype: str) -> None:
    """A 3-D weight [n][rows][cols]: n * rows rows of type wtype written as one tensor."""
    arr, raw = ms._tensor(rng, (n * rows, cols), std, _fit_type(wtype, cols))
    w.add_tensor(name, arr.reshape(n, rows, arr.shape[-1]), raw_dtype=raw,
                 raw_shape=(n, rows, cols) if raw == ms.mxfp4_ref.MXFP4 else None)


# gpt-oss's experts: gate and up values of std OAI_GU (a bias of std OAI_BIAS included) reach
# swiglu_oai's clamps (gate above 7: about 1% of them, up outside [-7, 7]: 2%); its outputs, of rms
# about OAI_ACT, are scaled back to O(1) by the down rows
OAI_GU, OAI_BIAS, OAI_ACT = 3.0, 1.0, 6.0


def _experts(w, add, add_f32, rng, p: str, E: int, F: int, mo: Moe, wtype: str,
             fused: bool = False) -> None:
    """The router (F32), stacked experts (F wide; fused: gate and up as one ffn_gate_up_exps,
    as some converters write them) and the shared expert of one layer.  The router's
    rows are large enough that the top-k choice differs between tokens; gpt-oss's router bias and
    expert biases (F32, [n_expert][rows]) are large enough to change choices and outputs."""
    X = mo.n_expert
    add_f32(p + "ffn_gate_inp.weight", 2.0 / math.sqrt(E) * rng.standard_normal((X, E)))
    if mo.oai:
        add_f32(p + "ffn_gate_inp.bias", rng.standard_normal(X))
    if mo.probs_bias:   # as large as the gaps between probabilities: it changes some choices
        add_f32(p + "exp_probs_b.bias", 0.1 * rng.standard_normal(X))
    gu = math.sqrt(OAI_GU ** 2 - OAI_BIAS ** 2) if mo.oai else 1.0
    down = 1.0 / OAI_ACT if mo.oai else 1.0
    if fused:   # ffn_gate_up_exps: the same draws, each expert's gate rows then its up rows
        t = _fit_type(wtype, E)
        g, raw = ms._tensor(rng, (X * F, E), gu / math.sqrt(E), t)
        u, _ = ms._tensor(rng, (X * F, E), gu / math.sqrt(E), t)
        gu_arr = np.concatenate([g.reshape(X, F, -1), u.reshape(X, F, -1)], axis=1)
        w.add_tensor(p + "ffn_gate_up_exps.weight", np.ascontiguousarray(gu_arr), raw_dtype=raw,
                     raw_shape=(X, 2 * F, E) if raw == ms.mxfp4_ref.MXFP4 else None)
    else:
        _add3(w, rng, p + "ffn_gate_exps.weight", X, F, E, gu / math.sqrt(E), wtype)
        _add3(w, rng, p + "ffn_up_exps.weight", X, F, E, gu / math.sqrt(E), wtype)
    _add3(w, rng, p + "ffn_down_exps.weight", X, E, F, down / math.sqrt(F), wtype)
    if mo.oai:
        for n, rows in (("gate", F), ("up", F), ("down", E)):
            add_f32(p + f"ffn_{n}_exps.bias", OAI_BIAS * rng.standard_normal((X, rows)))
    if mo.n_ff_shexp:
        S = mo.n_ff_shexp
        if mo.shexp_gate:
            add_f32(p + "ffn_gate_inp_shexp.weight", 1.0 / math.sqrt(E) * rng.standard_normal(E))
        add(p + "ffn_gate_shexp.weight", (S, E), 1.0 / math.sqrt(E))
        add(p + "ffn_up_shexp.weight", (S, E), 1.0 / math.sqrt(E))
        add(p + "ffn_down_shexp.weight", (E, S), 1.0 / math.sqrt(S))


def _mla_attention(w, add, norm, rng, p: str, E: int, n_head: int, mla: Mla, wtype: str) -> None:
    """One layer's latent attention tensors but attn_output: scaled so that scores are O(1) as in
    the other families (each decompressed K or V column sums kv_lora latent values of size 1)."""
    qk = mla.nope + mla.rope
    if mla.q_lora:
        add(p + "attn_q_a.weight", (mla.q_lora, E), 1.0 / math.sqrt(E))
        norm(p + "attn_q_a_norm.weight", mla.q_lora)
        add(p + "attn_q_b.weight", (n_head * qk, mla.q_lora), 1.3 / math.sqrt(mla.q_lora))
    else:
        add(p + "attn_q.weight", (n_head * qk, E), 1.3 / math.sqrt(E))
    add(p + "attn_kv_a_mqa.weight", (mla.kv_lora + mla.rope, E), 1.3 / math.sqrt(E))
    norm(p + "attn_kv_a_norm.weight", mla.kv_lora)
    _add3(w, rng, p + "attn_k_b.weight", n_head, mla.kv_lora, mla.nope, 1.3 / math.sqrt(mla.kv_lora), wtype)
    _add3(w, rng, p + "attn_v_b.weight", n_head, mla.v_head, mla.kv_lora, 1.0 / math.sqrt(mla.kv_lora), wtype)


def _mamba2_tensors(p: str, E: int, r: Recr, rng, add, add_f32) -> None:
    """One Mamba-2 mixer's tensors (granite-h, nemotron-h), as the converters write them: ssm_in rows
    z | x B C | dt, the convolution [channels][d_conv] and its bias, dt bias, A = -exp(A_log) and D
    as [n_head][1], the grouped norm [n_group][d_inner / n_group], ssm_out."""
    d_inner = r.d_inner(E)
    xbc = d_inner + 2 * r.n_group * r.d_state
    add(p + "ssm_in.weight", (d_inner + xbc + r.n_head, E), 1.0 / math.sqrt(E))   # z | x B C | dt
    add_f32(p + "ssm_conv1d.weight", 0.5 * rng.standard_normal((xbc, r.d_conv)))
    add_f32(p + "ssm_conv1d.bias", 0.1 * rng.standard_normal(xbc))
    # dt = softplus(N(bias, 1)) with bias in [-1.5, -0.5] and |A| in [0.5, 2]: dA = exp(dt A)
    # 0.36..0.93 between its 10th and 90th percentiles (median 0.7)
    add_f32(p + "ssm_dt.bias", rng.uniform(-1.5, -0.5, r.n_head))
    add_f32(p + "ssm_a", -np.exp(rng.uniform(math.log(0.5), math.log(2.0), (r.n_head, 1))))
    add_f32(p + "ssm_d", rng.uniform(0.5, 1.5, (r.n_head, 1)))
    add_f32(p + "ssm_norm.weight", 1.0 + 0.1 * rng.standard_normal((r.n_group, d_inner // r.n_group)))
    add(p + "ssm_out.weight", (E, d_inner), 1.0 / math.sqrt(d_inner))


def _nemotron_tensors(sh: Shape, rng, add, add_f32, norm) -> None:
    """nemotron-h's tensors: every layer one attn_norm and one of a Mamba-2 mixer, attention (q, k,
    v, output; no biases, no q/k norm) or an ungated MLP (ffn_up, ffn_down: relu(up h)^2 is about
    1.2 in rms, so the down rows of 1/sqrt(n_ff) give an O(1) branch); output_norm, untied output."""
    E, hd, F, r = sh.n_embd, sh.head_dim, sh.n_ff, sh.recr
    ws = 1.0 / math.sqrt(E)
    add("token_embd.weight", (sh.n_vocab, E), 0.2)
    for L in range(sh.n_layer):
        p = f"blk.{L}."
        norm(p + "attn_norm.weight", E)
        if L in r.attn:
            add(p + "attn_q.weight", (sh.n_head * hd, E), 1.3 * ws)
            add(p + "attn_k.weight", (sh.n_head_kv * hd, E), 1.3 * ws)
            add(p + "attn_v.weight", (sh.n_head_kv * hd, E), ws)
            add(p + "attn_output.weight", (E, sh.n_head * hd), 1.0 / math.sqrt(sh.n_head * hd))
        elif L in r.mlp:
            add(p + "ffn_up.weight", (F, E), ws)
            add(p + "ffn_down.weight", (E, F), 1.0 / math.sqrt(F))
        else:
            _mamba2_tensors(p, E, r, rng, add, add_f32)
    norm("output_norm.weight", E)
    add("output.weight", (sh.n_vocab, E), 0.2)


def _qwen35_tensors(sh: Shape, rng, add, add_f32, norm, untied: bool) -> None:
    """qwen35's tensors.  q and k are RMS-normed per head (attention) or L2-normalised (GDN), so
    their rows' scale only matters for the gates: the attention gate (the second half of each
    head's attn_q rows) is about N(0, 1.7) before its sigmoid, z N(0, 1), beta = sigmoid(ssm_beta h)
    of N(0, 1); the GDN decay exp(softplus(ssm_alpha h + dt bias) ssm_a) is as Mamba-2's dA (dt bias
    in [-1.5, -0.5], |A| in [0.5, 2]: median about 0.7).  The GDN output is RMS-normed per head, so
    ssm_out rows of 1/sqrt(d_inner) give an O(1) branch."""
    E, hd, F, r = sh.n_embd, sh.head_dim, sh.n_ff, sh.recr
    ws = 1.0 / math.sqrt(E)
    Hk, Hv, D = r.n_group, r.n_head, r.d_state
    d_inner, conv_dim = r.d_inner(E), (2 * r.n_group + r.n_head) * r.d_state
    add("token_embd.weight", (sh.n_vocab, E), 0.2)
    for L in range(sh.n_layer):
        p = f"blk.{L}."
        norm(p + "attn_norm.weight", E)
        if L in r.attn:
            add(p + "attn_q.weight", (sh.n_head * 2 * hd, E), 1.7 * ws)   # per head q | gate
            add(p + "attn_k.weight", (sh.n_head_kv * hd, E), 1.3 * ws)
            add(p + "attn_v.weight", (sh.n_head_kv * hd, E), ws)
            norm(p + "attn_q_norm.weight", hd)
            norm(p + "attn_k_norm.weight", hd)
            add(p + "attn_output.weight", (E, sh.n_head * hd), 1.0 / math.sqrt(sh.n_head * hd))
        else:
            add(p + "attn_qkv.weight", (conv_dim, E), ws)     # q | k | v
            add(p + "attn_gate.weight", (d_inner, E), ws)     # z
            add_f32(p + "ssm_conv1d.weight", 0.5 * rng.standard_normal((conv_dim, r.d_conv)))
            add_f32(p + "ssm_dt.bias", rng.uniform(-1.5, -0.5, Hv))
            add_f32(p + "ssm_a", -np.exp(rng.uniform(math.log(0.5), math.log(2.0), Hv)))
            add(p + "ssm_beta.weight", (Hv, E), ws)
            add(p + "ssm_alpha.weight", (Hv, E), ws)
            norm(p + "ssm_norm.weight", D)
            add(p + "ssm_out.weight", (E, d_inner), 1.0 / math.sqrt(d_inner))
        norm(p + "post_attention_norm.weight", E)
        add(p + "ffn_gate.weight", (F, E), ws)
        add(p + "ffn_up.weight", (F, E), ws)
        add(p + "ffn_down.weight", (E, F), 1.0 / math.sqrt(F))
    norm("output_norm.weight", E)
    if untied:
        add("output.weight", (sh.n_vocab, E), 0.2)


def _hybrid_tensors(fam: str, sh: Shape, rng, add, add_f32, norm, untied: bool) -> None:
    """The tensors of lfm2 / granite-h / nemotron-h (add: a matrix in the weight type, add_f32: as
    given, norm: a norm weight about 1; untied: lfm2 with an output.weight too).  Each branch's
    output is O(1) as in the other families; granite-h's embedding rows are small (scaled by 12 they
    are about 0.6), its q/k rows large enough that scores under attention.scale = 1/head_dim are as
    large as 1/sqrt(head_dim) would give, its output rows logit_scale times larger."""
    if fam == "nemotron-h":
        _nemotron_tensors(sh, rng, add, add_f32, norm)
        return
    if fam == "qwen35":
        _qwen35_tensors(sh, rng, add, add_f32, norm, untied)
        return
    E, hd, F, r = sh.n_embd, sh.head_dim, sh.n_ff, sh.recr
    granite = fam == "granite-h"
    ws = 1.0 / math.sqrt(E)
    qk = (math.sqrt(hd) / hd) ** -0.5 if granite else 1.0   # attention.scale 1/hd vs 1/sqrt(hd)
    add("token_embd.weight", (sh.n_vocab, E), 0.05 if granite else 0.2)
    for L in range(sh.n_layer):
        p = f"blk.{L}."
        norm(p + "attn_norm.weight", E)
        if L in r.attn:
            add(p + "attn_q.weight", (sh.n_head * hd, E), 1.3 * qk * ws)
            add(p + "attn_k.weight", (sh.n_head_kv * hd, E), 1.3 * qk * ws)
            add(p + "attn_v.weight", (sh.n_head_kv * hd, E), ws)
            if not granite:
                norm(p + "attn_q_norm.weight", hd)
                norm(p + "attn_k_norm.weight", hd)
            add(p + "attn_output.weight", (E, sh.n_head * hd), ws)
        elif granite:   # Mamba-2
            _mamba2_tensors(p, E, r, rng, add, add_f32)
        else:   # lfm2's short convolution: one row of l_cache taps per channel
            add_f32(p + "shortconv.conv.weight", rng.standard_normal((E, r.d_conv)) / math.sqrt(r.d_conv))
            add(p + "shortconv.in_proj.weight", (3 * E, E), ws)   # b | c | x
            add(p + "shortconv.out_proj.weight", (E, E), ws)
        norm(p + "ffn_norm.weight", E)
        add(p + "ffn_gate.weight", (F, E), ws)
        add(p + "ffn_up.weight", (F, E), ws)
        add(p + "ffn_down.weight", (E, F), 1.0 / math.sqrt(F))
    if granite:
        norm("output_norm.weight", E)
        add("output.weight", (sh.n_vocab, E), 0.2 * GRANITE_SCALES["logit_scale"])
    else:
        norm("token_embd_norm.weight", E)   # lfm2's output norm, under llama.cpp's name
        if untied:
            add("output.weight", (sh.n_vocab, E), 0.2)


def write_family(path: str, family: str, wtype: str = "F32", seed: int = 0, shape: str = "tiny",
                 extra_kv: dict | None = None, extra_tensors: tuple[str, ...] = (),
                 experts_last: bool = False, gate_up_fused: bool = False) -> str:
    """Write one random-weight model of `family` to path; returns path.  extra_kv (key -> str,
    float or int, written as string, float32 or uint32) and extra_tensors ("output" adds an
    untied output.weight) make the deliberately unusual files the refusal tests need;
    experts_last writes the stacked expert tensors after every other one (the same weights:
    a file whose tail only experts occupy); gate_up_fused writes each layer's expert gate and
    up rows as one ffn_gate_up_exps (the same weights)."""
    if family not in ARCH:
        raise ValueError(f"unknown family {family!r} (known: {', '.join(FAMILIES)})")
    if wtype not in ms.TYPES + ["MXFP4", "MXFP4-F32"]:   # the MXFP4 pair: tests/py/test_mxfp4.py
        raise ValueError(f"unknown weight type {wtype!r}")
    if family not in SHAPES[shape]:
        raise ValueError(f"shape {shape!r} has no {family!r}")
    sh = SHAPES[shape][family]
    rng = np.random.default_rng(seed)
    w = GGUFWriter(path, ARCH[family])
    base = _header(w, family, sh, os.path.basename(path).removesuffix(".tmp"))
    for k, v in (extra_kv or {}).items():
        if isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        else:
            w.add_uint32(k, int(v))
    E, hd, qd, kvd, F = sh.n_embd, sh.head_dim, sh.n_head * sh.head_dim, sh.n_head_kv * sh.head_dim, sh.n_ff
    gemma = family.startswith("gemma")

    def add(name, shp, std, t=wtype):
        arr, raw = ms._tensor(rng, shp, std, _fit_type(t, shp[-1]))
        w.add_tensor(name, arr, raw_dtype=raw, raw_shape=shp if raw == ms.mxfp4_ref.MXFP4 else None)

    def add_f32(name, arr):
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))

    late = []   # experts_last: the stacked experts' add_tensor calls, drawn in order, made last

    class _Late:   # a writer that keeps add_tensor calls for later
        @staticmethod
        def add_tensor(*args, **kw):
            late.append((args, kw))

    def norm(name, n, mean=1.0):
        add_f32(name, mean + 0.1 * rng.standard_normal(n))

    if sh.recr:
        _hybrid_tensors(family, sh, rng, add, add_f32, norm, "output" in extra_tensors)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path
    # gemma scales the embedding by sqrt(n_embd): keep its rows small as real checkpoints do
    add("token_embd.weight", (sh.n_vocab, E), 0.2)
    if family == "llama3":
        add_f32("rope_freqs.weight", llama3_rope_factors(base, hd))
    if family == "phi3":
        add_f32("rope_factors_long.weight", np.geomspace(1.0, 16.0, hd // 2))
        add_f32("rope_factors_short.weight", 1.0 + 0.5 * rng.random(hd // 2))
    ws = 1.0 / math.sqrt(E)
    for L in range(sh.n_layer):
        p = f"blk.{L}."
        norm(p + "attn_norm.weight", E)
        if family in MLA:
            _mla_attention(w, add, norm, rng, p, E, sh.n_head, MLA[family], wtype)
        elif family == "phi3":
            add(p + "attn_qkv.weight", (qd + 2 * kvd, E), 1.3 * ws)
        else:
            add(p + "attn_q.weight", (qd, E), 1.3 * ws)
            add(p + "attn_k.weight", (kvd, E), 1.3 * ws)
            add(p + "attn_v.weight", (kvd, E), ws)
        if family in ("qwen2moe", "gpt-oss"):
            bias = 0.1 if family == "qwen2moe" else 0.5
            for b, n in (("q", qd), ("k", kvd), ("v", kvd)):
                add_f32(p + f"attn_{b}.bias", bias * rng.standard_normal(n))
        if family in ("qwen3", "qwen3moe", "gemma3"):
            norm(p + "attn_q_norm.weight", hd)
            norm(p + "attn_k_norm.weight", hd)
        if family == "olmoe":   # the whole q / k row
            norm(p + "attn_q_norm.weight", qd)
            norm(p + "attn_k_norm.weight", kvd)
        add(p + "attn_output.weight", (E, sh.n_head * MLA[family].v_head if family in MLA else qd), ws)
        if family == "gpt-oss":
            add_f32(p + "attn_output.bias", 0.5 * rng.standard_normal(E))
            # logits of the scores' size: the sink takes a share of every row
            add_f32(p + "attn_sinks.weight", rng.standard_normal(sh.n_head))
            norm(p + "post_attention_norm.weight", E)   # the FFN's input norm
        else:
            if gemma:
                norm(p + "post_attention_norm.weight", E, 2.5)   # layers rival the scaled embedding
            norm(p + "ffn_norm.weight", E)
        if family in MOE and L >= moe_of(family, sh).n_dense_lead:
            # mixtral and olmoe read no expert width: their experts are feed_forward_length wide
            F_exp = F if family in ("mixtral", "olmoe") else MOE[family].n_ff_exp
            _experts(_Late if experts_last else w, add, add_f32, rng, p, E, F_exp,
                     moe_of(family, sh), wtype, fused=gate_up_fused)
            continue
        if family == "phi3":
            add(p + "ffn_up.weight", (2 * F, E), ws)
        else:
            add(p + "ffn_gate.weight", (F, E), ws)
            add(p + "ffn_up.weight", (F, E), ws)
        add(p + "ffn_down.weight", (E, F), 1.0 / math.sqrt(F))
        if gemma:
            norm(p + "post_ffw_norm.weight", E, 2.5)
    norm("output_norm.weight", E)
    if family in ("llama3", "mistral", "phi3", "mixtral", "qwen2moe", "olmoe", "gpt-oss") or family in MLA \
            or "output" in extra_tensors:
        add("output.weight", (sh.n_vocab, E), 0.2)
    for args, kw in late:
        w.add_tensor(*args, **kw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def make_family(outdir: str, family: str, wtype: str = "F32", shape: str = "tiny") -> str:
    """Write (once) and return outdir/{family}-{wtype}[-1b].gguf; the seed follows the name."""
    os.makedirs(outdir, exist_ok=True)
    name = f"{family}-{wtype}" + ("" if shape == "tiny" else f"-{shape}")
    path = os.path.join(outdir, name + ".gguf")
    if not os.path.exists(path):
        tmp = path + ".tmp"
        write_family(tmp, family, wtype, seed=zlib.crc32(name.encode()), shape=shape)
        os.replace(tmp, path)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("family", choices=FAMILIES + ["all"])
    ap.add_argument("--wtype", default="F32", choices=ms.TYPES)
    ap.add_argument("--shape", default="tiny", choices=list(SHAPES))
    a = ap.parse_args(argv)
    for fam in ([f for f in FAMILIES if f in SHAPES[a.shape]] if a.family == "all" else [a.family]):
        print(make_family(a.outdir, fam, a.wtype, a.shape))
    return 0


if __name__ == "__main__":
    sys.exit(main())
