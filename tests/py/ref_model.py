#!/usr/bin/env python3
"""Independent float64 numpy reference forward pass for GGUF decoder models.

Supports llama.cpp's `llama` (NORMAL rope: adjacent pairs; rope_freqs, LongRoPE factors),
`qwen2` (NEOX rope: pairs (i, i + rope_dim/2), q/k/v biases), `qwen3` (per-head q/k RMS
norm before rope), `gemma2` (sqrt(n_embd) embedding scale, post-attention/post-FFN norms,
GeGLU with tanh GELU, attention and final logit soft-capping, sliding window on layers
il % 2 == 0), `gemma3` (as gemma2 with q/k norm, no attention soft-cap, sliding window on
layers il % 6 < 5 with rope.freq_base_swa (default 10000) unscaled) and `phi3` (fused
attn_qkv and gate|up ffn_up, LongRoPE long/short factors and attn_factor), and the mixtures of
experts `llama` with expert_count (Mixtral), `qwen2moe` (shared expert with a sigmoid gate),
`qwen3moe`, `olmoe` (q/k RMS norm over the whole row) and `deepseek2` (multi-head latent
attention computed in its decompressed multi-head form; leading dense layers, softmax or sigmoid
routing with selection bias and expert groups, an ungated shared expert) and `gpt-oss` (llama.cpp's
openai-moe: q/k/v/output biases, attention sinks, sliding window on layers il % 2 == 0, YaRN,
post_attention_norm before the FFN, router bias, softmax over the chosen experts' logits, expert
biases, swiglu_oai), and the hybrids whose layers with head_count_kv 0 are recurrent: `lfm2`
(LFM2: a gated short convolution y = c * conv(b * x) of shortconv.l_cache taps per channel,
per-head q/k norm and NEOX rope in the attention layers, token_embd_norm as the output norm) and
`granitehybrid` (Granite-4.0-H: Mamba-2 layers; embedding_scale, residual_scale on both branches,
attention.scale, logit_scale; no rope when rope.scaling.finetuned is false) and `nemotron_h`
(Nemotron-H, dense: every layer x + one sublayer of rmsnorm(x) attn_norm: the Mamba-2 mixer where
head_count_kv and feed_forward_length are 0, attention without rope (llama.cpp's rope type NONE;
scale 1/sqrt(key_length)) where feed_forward_length is 0, else the ungated MLP ffn_down
relu(ffn_up h)^2; the RMS eps attention.layer_norm_rms_epsilon, else attention.layer_norm_epsilon;
ssm.inner_size any multiple of the SSM heads) and `qwen35` (Qwen3.5, dense: recurrent layers from
attention.recurrent_layers, else every layer but each full_attention_interval-th; x + mixer(rmsnorm(x)
attn_norm), then x + SwiGLU(rmsnorm(x) post_attention_norm); gated attention (attn_q rows per head
q | gate, per-head q/k RMS norm, interleaved M-RoPE over rope.dimension_count dims, which for text
positions is NEOX rope over those dims except pairs in no section, which take position 0; the
heads times sigmoid(gate)); Gated DeltaNet layers (qkv conv + silu, per-head L2 norm of q and k,
V head h on K head h % n_k_heads, the delta rule, a per-head RMS norm times silu(z))), each written
from llama.cpp's graph builders (src/models/*.cpp, the SSM maths from ggml's ssm_conv / ssm_scan /
gated_delta_net) as semantics, not from kvant.  The recurrent layers run token by token (the
recurrence), or with ssm_chunk = K in chunks of K tokens: Mamba-2 as the chunked state-space-duality
form (a quadratic form inside a chunk with segment sums of log dA, the state passed between chunks),
the short convolution a chunk at a time, the delta rule as the chunked WY form (a unit
lower-triangular solve per chunk, the state passed between chunks).  forward(ids, state=State())
continues from a State (the K/V of the attention layers, the convolution rows and SSM states of the
recurrent ones), so a sequence can run in pieces.
Weights are dequantized with gguf.quants.dequantize (exact values of what is stored, f32)
and all arithmetic is done in float64.

    python tests/py/ref_model.py MODEL.gguf --tokens 1,2,3 --out logits.npy
    python tests/py/ref_model.py MODEL.gguf --text-file tests/data/english.txt --ppl 512
        (--text-file uses approx_tokenize, a simple byte-level BPE good enough for
         self-checks; the tests tokenize with `kvant tokenize`.)
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass, field

import numpy as np
from gguf import GGUFReader
from gguf.constants import GGMLQuantizationType as QT
from gguf import quants

ROPE_NORMAL = "normal"   # rotate (x[2i], x[2i+1])
ROPE_NEOX = "neox"       # rotate (x[i], x[i + n_rot/2])
ARCH_ROPE = {"llama": ROPE_NORMAL, "qwen2": ROPE_NEOX, "qwen3": ROPE_NEOX, "gemma2": ROPE_NEOX,
             "gemma3": ROPE_NEOX, "phi3": ROPE_NEOX, "qwen2moe": ROPE_NEOX, "qwen3moe": ROPE_NEOX,
             "olmoe": ROPE_NEOX, "deepseek2": ROPE_NORMAL, "gpt-oss": ROPE_NEOX,
             "lfm2": ROPE_NEOX, "granitehybrid": ROPE_NORMAL, "nemotron_h": ROPE_NORMAL,
             "qwen35": ROPE_NEOX}   # qwen35: IMROPE, rotating NEOX pairs (see _qwen35)
# hybrids: a layer whose head_count_kv is 0 is recurrent (llama.cpp's is_recr; nemotron_h: and
# feed_forward_length 0, a layer with head_count_kv 0 and an n_ff being an MLP; qwen35: as
# attention.recurrent_layers or full_attention_interval say)
HYBRID_ARCHS = ("lfm2", "granitehybrid", "nemotron_h", "qwen35")
# mixtures of experts (llama.cpp build_moe_ffn): softmax over ffn_gate_inp, top expert_used_count,
# the chosen probabilities divided by their sum where the family's graph passes norm_w = true;
# deepseek2 reads its gating, norm_w and weight scale from the header (expert_gating_func,
# expert_weights_norm, expert_weights_scale); gpt-oss's graph selects on the router logits and
# takes the softmax of the chosen ones (llama.cpp's SOFTMAX_WEIGHT)
MOE_NORM_W = {"llama": True, "qwen3moe": True, "qwen2moe": False, "olmoe": False}
GATING_SOFTMAX, GATING_SIGMOID, GATING_SOFTMAX_WEIGHT = 1, 2, 3   # llama.cpp's gating kinds
# llama.cpp's YaRN rope (rope.scaling.type yarn) by architecture; the others refuse it
YARN_ARCHS = ("deepseek2", "gpt-oss")
# llama.cpp's sliding-window pattern when the file gives none: layer il slides when il % n < n - 1
SWA_PATTERN = {"gemma2": 2, "gemma3": 6, "gpt-oss": 2}
# gpt-oss's swiglu_oai (llama.cpp's constants; the converter writes no key): (alpha, limit)
SWIGLU_OAI = (1.702, 7.0)


def _field(reader: GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


@dataclass
class State:
    """What a forward pass leaves for the tokens after it: n_past positions; per attention layer
    its keys (after rope) and values [n_past][n_head_kv][head_dim]; per recurrent layer the last
    d_conv - 1 convolution input rows [d_conv - 1][channels] and the SSM state: Mamba-2's
    [head][head_dim][d_state], the Gated DeltaNet's [v_head][head_v_dim][head_k_dim] (S[v][k]: ggml's
    [S_v, S_v, H_v] state with the k index in ne0, the v index in ne1)."""
    n_past: int = 0
    kv: dict = field(default_factory=dict)     # layer -> (k, v)
    conv: dict = field(default_factory=dict)   # layer -> conv rows
    ssm: dict = field(default_factory=dict)    # layer -> SSM state


def silu(v: np.ndarray) -> np.ndarray:
    return v / (1.0 + np.exp(-v))


def softplus(v: np.ndarray) -> np.ndarray:
    """ggml's: v above 20, else log(1 + exp(v))."""
    return np.where(v > 20.0, v, np.log1p(np.exp(np.minimum(v, 20.0))))


def dequant(t) -> np.ndarray:
    """Dequantize a ReaderTensor to float32 numpy with numpy shape [ne1][ne0] (reversed GGUF dims)."""
    shape = tuple(int(d) for d in reversed(t.shape))
    tt = QT(int(t.tensor_type))
    if tt == QT.F32:
        a = np.asarray(t.data, dtype=np.float32)
    elif tt == QT.F16:
        a = np.asarray(t.data).view(np.float16).astype(np.float32)
    else:
        a = quants.dequantize(np.asarray(t.data), tt).astype(np.float32, copy=False)
    return a.reshape(shape)


class RefModel:
    def __init__(self, path: str, rope_mode: str | None = None, dtype=np.float64, ssm_chunk: int = 0):
        self.path = path
        self.ssm_chunk = ssm_chunk   # 0: the recurrent layers token by token; K: in chunks of K
        self.dt = np.dtype(dtype)  # float64 = the reference; float32 only to estimate f32 engine error
        r = GGUFReader(path)
        self.reader = r
        arch = _field(r, "general.architecture")
        if arch not in ARCH_ROPE:
            raise ValueError(f"unsupported architecture {arch!r}")
        self.arch = arch
        self.tensors = {t.name: t for t in r.tensors}
        g = lambda k, d=None: _field(r, f"{arch}.{k}", d)  # noqa: E731
        self.n_layer = int(g("block_count"))
        self.n_embd = int(g("embedding_length"))
        ff = g("feed_forward_length")  # a list for per-layer widths (a width-pruned model)
        self.n_ff = [int(v) for v in ff] if isinstance(ff, (list, tuple)) else [int(ff)] * self.n_layer
        # head counts: ints, or per-layer lists (KV-head groups pruned unevenly)
        per_layer = lambda v: [int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)] * self.n_layer  # noqa: E731
        self.n_heads = per_layer(g("attention.head_count"))
        self.n_heads_kv = per_layer(g("attention.head_count_kv", self.n_heads))
        self.n_head = max(self.n_heads)
        # nemotron_h: llama.cpp requires attention.layer_norm_epsilon and takes it for the RMS eps
        # unless attention.layer_norm_rms_epsilon is given (its converter writes only the former)
        eps0 = float(g("attention.layer_norm_epsilon")) if arch == "nemotron_h" else 1e-5
        self.eps = float(g("attention.layer_norm_rms_epsilon", eps0))
        self.head_dim = int(g("attention.key_length", self.n_embd // self.n_head))
        self.freq_base = float(g("rope.freq_base", 10000.0))
        self.n_rot = int(g("rope.dimension_count", self.head_dim))
        self.n_ctx_train = int(g("context_length", 0))
        st = g("rope.scaling.type", None)
        self.rope_scale = 1.0
        if st in ("linear", "longrope", "yarn", None):   # llama.cpp: the factor scales unless none
            f = float(g("rope.scaling.factor", 0.0) or 0.0)
            self.rope_scale = 1.0 / f if f else 1.0
        elif st != "none":
            raise ValueError(f"unsupported rope scaling {st!r}")
        self.attn_factor = float(g("rope.scaling.attn_factor", 1.0))
        self.yarn = st == "yarn" and arch in YARN_ARCHS
        if st == "yarn" and not self.yarn:
            raise ValueError(f"yarn rope scaling for {arch} is not in the reference")
        self._yarn(g)
        self.rope_mode = rope_mode or ARCH_ROPE[arch]
        te = self.tensors["token_embd.weight"]
        self.n_vocab = int(te.shape[1])
        self._cache: dict[str, np.ndarray] = {}
        self.n_expert = int(g("expert_count", 0) or 0)
        self.n_expert_used = int(g("expert_used_count", 0) or 0)
        self._family(g)

    def _family(self, g) -> None:
        """Per-family recipe facts, as llama.cpp's load_arch_hparams sets them."""
        a, nl = self.arch, self.n_layer
        self.gemma = a in ("gemma2", "gemma3")
        self.emb_scale = math.sqrt(self.n_embd) if self.gemma else 1.0
        self.attn_cap = float(g("attn_logit_softcapping", 50.0)) if a == "gemma2" else 0.0
        self.final_cap = float(g("final_logit_softcapping", 30.0 if a == "gemma2" else 0.0)) \
            if self.gemma else 0.0
        self.q_scale = 1.0 / math.sqrt(self.head_dim)
        if self.gemma and nl == {"gemma2": 46, "gemma3": 62}[a]:   # the 27B models
            self.q_scale = 1.0 / math.sqrt(self.n_embd / self.n_head)
        self.window = [0] * nl
        self.kv_budget = None   # (sinks, recent, block size): the KV-budget mask (attend)
        # kvant's snapkv policy (attend): dict(prompt, obs_from, n, keep, recent, bs, pool)
        self.snapkv = None
        # kvant's h2o policy (attend): dict(prompt, keep, recent, bs, sink_blocks)
        self.h2o = None
        self.snap_gaps: list[float] = []   # each selection's margin (snap_keep, _h2o_probs)
        self.base_l = [self.freq_base] * nl
        self.scale_l = [self.rope_scale] * nl
        win = int(g("attention.sliding_window", 4096 if a == "gemma2" else 0))
        if a in SWA_PATTERN and win > 0:   # gemma3's window layers: their own base, unscaled
            pat = g("attention.sliding_window_pattern", SWA_PATTERN[a])
            swa = list(pat) if isinstance(pat, (list, tuple)) else \
                [int(pat) == 0 or il % int(pat) < int(pat) - 1 for il in range(nl)]
            base_swa = float(g("rope.freq_base_swa", 10000.0 if a == "gemma3" else self.freq_base))
            for il in range(nl):
                if swa[il]:
                    self.window[il] = win
                    self.base_l[il] = base_swa
                    self.scale_l[il] = 1.0 if a == "gemma3" else self.rope_scale
        self.ffn_norm = "post_attention_norm.weight" if a in ("gpt-oss", "qwen35") else "ffn_norm.weight"
        self.swiglu_oai = SWIGLU_OAI if a == "gpt-oss" else None
        self._moe_routing(g)
        self._hybrid(g)
        # deepseek2's latent attention: key_length / value_length describe the absorbed form
        self.mla = a == "deepseek2"
        if self.mla:
            self.kv_lora = int(g("attention.kv_lora_rank"))
            self.head_k = int(g("attention.key_length_mla", 0))   # nope + rope; the value head
            if not (self.head_k and self.has("blk.0.attn_k_b.weight")):   # size is attn_v_b's
                raise ValueError("deepseek2 without key_length_mla and attn_k_b (an old file's fused "
                                 "attn_kv_b) is not supported")
            # llama.cpp's deepseek2 graph pre-scales for YaRN: mscale^2 / sqrt(key_length_mla)
            lnF = math.log(1.0 / self.rope_scale)
            af = self.graph_attn_factor if self.yarn else self.attn_factor
            ms = af * (1.0 + 0.1 * lnF) * (1.0 + 0.1 * self.log_mul * lnF)
            self.q_scale = ms * ms / math.sqrt(self.head_k)
        # rope factors: rope_freqs, else LongRoPE long/short by llama.cpp's default context
        # (n_ctx = context_length: long when it exceeds original_context_length)
        self.factors = None
        if self.has("rope_freqs.weight"):
            self.factors = "rope_freqs.weight"
        elif self.has("rope_factors_long.weight"):
            orig = int(g("rope.scaling.original_context_length", self.n_ctx_train))
            self.factors = "rope_factors_long.weight" if self.n_ctx_train > orig else "rope_factors_short.weight"

    def _hybrid(self, g) -> None:
        """The hybrids' recipe, as llama.cpp's load_arch_hparams reads it (the rest of the model
        sets the defaults: no recurrent layer, output_norm, no granite multiplier, rope on).  The
        switches ssm_gate (y * silu(z)) and ssm_norm_groups (None: the file's group count) exist
        for the tests that show each part matters."""
        a = self.arch
        self.one_sublayer = a == "nemotron_h"   # x + (mixer | attention | MLP)(attn_norm x)
        self.recr = [a in HYBRID_ARCHS and self.n_heads_kv[L] == 0 and
                     (not self.one_sublayer or self.n_ff[L] == 0) for L in range(self.n_layer)]
        self.relu_sq = True   # nemotron_h's MLP: relu(up h)^2 (False: relu alone, a test's switch)
        self.out_norm = "token_embd_norm.weight" if a == "lfm2" else "output_norm.weight"
        self.res_scale = 0.0     # granite: x + s * branch (0: none)
        self.logit_scale = 0.0   # granite: logits / s (0: none)
        self.use_rope = True
        self.ssm_gate = True
        self.ssm_norm_groups = None
        self.q_gate = False        # qwen35: attn_q rows per head q | gate
        self.rope_sections = None  # qwen35: interleaved M-RoPE sections
        if a == "lfm2":
            self.d_conv = int(g("shortconv.l_cache"))
        if a == "qwen35":
            self._qwen35(g)
        if a not in ("granitehybrid", "nemotron_h"):
            return
        if a == "granitehybrid":
            self.emb_scale = float(g("embedding_scale", 0.0)) or 1.0
            self.res_scale = float(g("residual_scale", 0.0))
            self.logit_scale = float(g("logit_scale", 0.0))
            self.use_rope = bool(g("rope.scaling.finetuned", True))   # Granite's rope switch
            if float(g("attention.scale", 0.0)):
                self.q_scale = float(g("attention.scale"))
        else:   # nemotron_h: llama.cpp's rope type NONE whatever the file says, 1/sqrt(head_dim)
            self.use_rope = False
        self.d_conv = int(g("ssm.conv_kernel"))
        self.d_inner = int(g("ssm.inner_size"))
        self.d_state = int(g("ssm.state_size"))
        self.n_ssm_head = int(g("ssm.time_step_rank"))
        self.n_group = int(g("ssm.group_count"))
        if (a == "granitehybrid" and self.d_inner != 2 * self.n_embd) or self.d_inner % self.n_ssm_head \
                or self.n_ssm_head % self.n_group:
            raise ValueError(f"{a}: ssm.inner_size {self.d_inner}, {self.n_ssm_head} heads, "
                             f"{self.n_group} groups do not fit (heads divide inner_size, groups divide "
                             f"heads; granitehybrid: llama.cpp asserts inner_size = 2 n_embd)")

    def _qwen35(self, g) -> None:
        """qwen35 as llama.cpp's llama_model_qwen35 reads it: a layer is recurrent where
        attention.recurrent_layers says so, else where (il + 1) % full_attention_interval (default 4)
        != 0; ssm.group_count K heads and ssm.time_step_rank V heads, each ssm.state_size wide
        (head_v_dim = ssm.inner_size / V heads must equal it); rope.dimension_sections required.
        Switches for the tests that show each part matters: attn_gate (heads * sigmoid(gate)),
        gdn_kmap ("tile": V head h reads K head h % n_k, as ggml_repeat_4d and the fused
        ggml_gated_delta_net do; "group": h // (n_v / n_k), the HF checkpoint's order before the
        converter reorders the V heads), gdn_l2 ("head": q and k L2-normalised per head; "row": over
        the whole q / k row, a wrong variant), gdn_q_scale (q times 1/sqrt(state_size))."""
        nl = self.n_layer
        rl = g("attention.recurrent_layers", None)
        if rl is not None:
            self.recr = [bool(v) for v in rl][:nl]
        else:
            iv = int(g("full_attention_interval", 4))
            self.recr = [(L + 1) % iv != 0 for L in range(nl)]
        self.d_conv = int(g("ssm.conv_kernel"))
        self.d_inner = int(g("ssm.inner_size"))
        self.d_state = int(g("ssm.state_size"))
        self.n_k_head = int(g("ssm.group_count"))
        self.n_v_head = int(g("ssm.time_step_rank"))
        if self.d_inner != self.n_v_head * self.d_state or self.n_v_head % self.n_k_head:
            raise ValueError(f"qwen35: ssm.inner_size {self.d_inner} is not time_step_rank {self.n_v_head} * "
                             f"state_size {self.d_state}, or the K heads {self.n_k_head} do not divide the V heads")
        sec = g("rope.dimension_sections", None)
        if sec is None:
            raise ValueError("qwen35: no rope.dimension_sections (llama.cpp requires it)")
        self.rope_sections = [int(v) for v in sec][:4] + [0] * (4 - len(sec))
        self.q_gate = True
        self.attn_gate = True
        self.gdn_kmap = "tile"
        self.gdn_l2 = "head"
        self.gdn_q_scale = True

    def imrope_text_pairs(self) -> np.ndarray:
        """Which of the n_rot / 2 rotated pairs turn with a text token's position under ggml's
        interleaved M-RoPE (GGML_ROPE_TYPE_IMROPE): pair i's sector is i % sum(sections); sectors
        0, 3, .. below 3 sections[0] take position t, 1, 4, .. below 3 sections[1] position h,
        2, 5, .. below 3 sections[2] position w, any other the 4th position e.  llama.cpp gives a
        text token t = h = w = its position and e = 0, so those others do not turn."""
        sec = self.rope_sections
        sector = np.arange(self.n_rot // 2) % sum(sec)
        m = sector % 3
        return ((m == 0) & (sector < 3 * sec[0])) | ((m == 1) & (sector < 3 * sec[1])) | \
            ((m == 2) & (sector < 3 * sec[2]))

    def _moe_routing(self, g) -> None:
        """build_moe_ffn's parameters, as llama.cpp's loader reads them: expert groups for every
        architecture, the rest from the header for deepseek2 only (gpt-oss's gating is its
        graph's)."""
        ds = self.arch == "deepseek2"
        self.n_dense_lead = int(g("leading_dense_block_count", 0)) if ds else 0
        self.gating = int(g("expert_gating_func", GATING_SOFTMAX)) if ds else \
            GATING_SOFTMAX_WEIGHT if self.arch == "gpt-oss" else GATING_SOFTMAX
        if self.gating not in (GATING_SOFTMAX, GATING_SIGMOID, GATING_SOFTMAX_WEIGHT):
            raise ValueError(f"unsupported expert_gating_func {self.gating}")
        self.norm_w = bool(g("expert_weights_norm", False)) if ds else MOE_NORM_W.get(self.arch, False)
        self.w_scale = float(g("expert_weights_scale", 0.0)) if ds else 0.0
        self.n_groups = int(g("expert_group_count", 0))
        self.n_group_used = int(g("expert_group_used_count", 0))

    def has(self, name: str) -> bool:
        return name in self.tensors

    def w(self, name: str) -> np.ndarray:
        """float32 dequantized weight [ne1][ne0] (cached)."""
        a = self._cache.get(name)
        if a is None:
            a = dequant(self.tensors[name])
            self._cache[name] = a
        return a

    def w64(self, name: str) -> np.ndarray:
        return self.w(name).astype(self.dt, copy=False)

    # ---- building blocks (float64) ----
    def _yarn(self, g) -> None:
        """YaRN as llama.cpp applies it: angles ramp from extrapolated (dims below beta_fast's
        correction dim) to interpolated (above beta_slow's), betas 32 and 1 unless the file gives
        yarn_beta_fast / yarn_beta_slow; cos and sin are scaled by the context's yarn attn_factor
        (1 without yarn_log_multiplier, as gpt-oss) times 1 + 0.1 ln F.  deepseek2 files store
        0.1 * mscale_all_dim as yarn_log_multiplier (llama.cpp divides it back)."""
        F = 1.0 / self.rope_scale
        self.log_mul = float(g("rope.scaling.yarn_log_multiplier", 0.0) or 0.0) / 0.1
        if not self.yarn:
            return
        af = 1.0 if self.log_mul else (0.1 * math.log(F) + 1.0 if F > 1.0 else 1.0)
        af /= 1.0 + 0.1 * math.log(F)
        self.attn_factor *= af                      # the graph's attn_factor ...
        self.graph_attn_factor = self.attn_factor
        self.attn_factor *= 1.0 + 0.1 * math.log(F)  # ... and rope_yarn's extra factor
        orig = float(g("rope.scaling.original_context_length", self.n_ctx_train))
        corr = lambda beta: self.n_rot * math.log(orig / (beta * 2 * math.pi)) / (2 * math.log(self.freq_base))
        fast = float(g("rope.scaling.yarn_beta_fast", 32.0))
        slow = float(g("rope.scaling.yarn_beta_slow", 1.0))
        self.corr = (max(0.0, math.floor(corr(fast))), min(self.n_rot - 1.0, math.ceil(corr(slow))))

    def rmsnorm(self, x: np.ndarray, wname: str) -> np.ndarray:
        ms = np.mean(x * x, axis=-1, keepdims=True)
        return x / np.sqrt(ms + self.dt.type(self.eps)) * self.w64(wname)

    def rope_thetas(self, pos: np.ndarray, base: float | None = None, scale: float | None = None) -> np.ndarray:
        """theta[p, i] for i < n_rot/2."""
        base = self.freq_base if base is None else base
        scale = self.rope_scale if scale is None else scale
        i = np.arange(self.n_rot // 2, dtype=np.float64)
        inv = base ** (-2.0 * i / self.n_rot)
        if self.factors:
            ff = self.w(self.factors).astype(np.float64).reshape(-1)[: self.n_rot // 2]
            inv = inv / ff
        if self.yarn:   # mix of the extrapolated (ramp 1) and interpolated (ramp 0) angles
            lo, hi = self.corr
            ramp = 1.0 - np.clip((i - lo) / max(0.001, hi - lo), 0.0, 1.0)
            inv = inv * (scale * (1.0 - ramp) + ramp)
            return pos.astype(np.float64)[:, None] * inv[None, :]
        th = (pos.astype(np.float64) * scale)[:, None] * inv[None, :]
        if self.rope_sections is not None:   # qwen35: pairs of the 4th section stay at position 0
            th = th * self.imrope_text_pairs()[None, :]
        return th

    def rope(self, x: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """x: [n, heads, head_dim]; theta: [n, n_rot/2]."""
        c = np.cos(theta)[:, None, :] * self.attn_factor   # ggml's mscale on cos and sin
        s = np.sin(theta)[:, None, :] * self.attn_factor
        out = x.copy()
        half = self.n_rot // 2
        if self.rope_mode == ROPE_NORMAL:
            x0 = x[:, :, 0:self.n_rot:2]
            x1 = x[:, :, 1:self.n_rot:2]
            out[:, :, 0:self.n_rot:2] = x0 * c - x1 * s
            out[:, :, 1:self.n_rot:2] = x0 * s + x1 * c
        else:
            x0 = x[:, :, :half]
            x1 = x[:, :, half:self.n_rot]
            out[:, :, :half] = x0 * c - x1 * s
            out[:, :, half:self.n_rot] = x0 * s + x1 * c
        return out

    def lin(self, h: np.ndarray, name: str) -> np.ndarray:
        y = h @ self.w64(name + ".weight").T
        if self.has(name + ".bias"):
            y = y + self.w64(name + ".bias").reshape(-1)
        return y

    def qkv(self, h: np.ndarray, p: str, nh: int, nkv: int):
        n, hd = h.shape[0], self.head_dim
        if self.has(p + "attn_qkv.weight"):   # phi3: rows Q | K | V
            y = self.lin(h, p + "attn_qkv")
            qd, kd = nh * hd, nkv * hd
            q, k, v = y[:, :qd], y[:, qd:qd + kd], y[:, qd + kd:qd + 2 * kd]
        else:
            q, k, v = self.lin(h, p + "attn_q"), self.lin(h, p + "attn_k"), self.lin(h, p + "attn_v")
        return q.reshape(n, nh, hd), k.reshape(n, nkv, hd), v.reshape(n, nkv, hd)

    def qkv_gated(self, h: np.ndarray, p: str, nh: int, nkv: int):
        """qwen35's attention inputs (q, gate, k, v): attn_q gives per head head_dim q values then
        head_dim gate values (llama.cpp's views of Qcur_full at offsets 0 and n_embd_head)."""
        n, hd = h.shape[0], self.head_dim
        qg = self.lin(h, p + "attn_q").reshape(n, nh, 2 * hd)
        k, v = self.lin(h, p + "attn_k"), self.lin(h, p + "attn_v")
        return qg[:, :, :hd], qg[:, :, hd:], k.reshape(n, nkv, hd), v.reshape(n, nkv, hd)

    def gated(self, h: np.ndarray, g: np.ndarray, u: np.ndarray, d: np.ndarray,
              b=(0.0, 0.0, 0.0)) -> np.ndarray:
        """d (silu(g h + b_g) * (u h + b_u)) + b_d; gpt-oss's swiglu_oai instead: the gate clamped
        above at limit, the up to [-limit, limit], x sigmoid(alpha x) (up + 1)."""
        gt, up = h @ g.T + b[0], h @ u.T + b[1]
        if self.swiglu_oai:
            alpha, limit = self.swiglu_oai
            gt, up = np.minimum(gt, limit), np.clip(up, -limit, limit) + self.dt.type(1)
            return (gt / (self.dt.type(1) + np.exp(-alpha * gt)) * up) @ d.T + b[2]
        return ((gt / (self.dt.type(1) + np.exp(-gt))) * up) @ d.T + b[2]

    def route(self, h: np.ndarray, p: str) -> tuple[np.ndarray, np.ndarray]:
        """(chosen experts [n][k], their weights [n][k]).  Router logits: ffn_gate_inp h (plus
        ffn_gate_inp.bias where there is one); probabilities: their softmax, sigmoid (gating 2) or
        the logits themselves (gating 3); selected on probabilities + exp_probs_b where there is
        one; with expert groups (count > 1: consecutive runs of experts) only the n_group_used
        groups whose two best selection values sum highest take part; the top k of the selection
        (ties: lower index) weighted by the unbiased probabilities (gating 3: their softmax over
        the k), divided by their sum where norm_w, times expert_weights_scale unless it is 0 or 1."""
        logits = self.lin(h, p + "ffn_gate_inp")
        if self.gating == GATING_SIGMOID:
            pr = 1.0 / (1.0 + np.exp(-logits))
        elif self.gating == GATING_SOFTMAX_WEIGHT:
            pr = logits
        else:
            pr = np.exp(logits - logits.max(axis=-1, keepdims=True))
            pr /= pr.sum(axis=-1, keepdims=True)
        score = pr + self.w64(p + "exp_probs_b.bias").reshape(-1) if self.has(p + "exp_probs_b.bias") else pr
        if self.n_groups > 1:
            grouped = score.reshape(len(h), self.n_groups, -1)
            best2 = np.sort(grouped, axis=-1)[..., -2:].sum(axis=-1)           # [n][groups]
            kept = np.argsort(-best2, axis=-1, kind="stable")[:, :self.n_group_used]
            off = np.ones(best2.shape, dtype=bool)
            np.put_along_axis(off, kept, False, axis=-1)
            score = np.where(off[:, :, None], -np.inf, grouped).reshape(score.shape)
        sel = np.argsort(-score, axis=-1, kind="stable")[:, :self.n_expert_used]
        wt = np.take_along_axis(pr, sel, axis=-1)
        if self.gating == GATING_SOFTMAX_WEIGHT:
            wt = np.exp(wt - wt.max(axis=-1, keepdims=True))
            wt /= wt.sum(axis=-1, keepdims=True)
        if self.norm_w:
            wt = wt / np.maximum(wt.sum(axis=-1, keepdims=True), 6.103515625e-5)
        if self.w_scale not in (0.0, 1.0):
            wt = wt * self.w_scale
        return sel, wt

    def moe(self, h: np.ndarray, p: str) -> np.ndarray:
        """The routed experts' SwiGLU (with their rows of ffn_{gate,up,down}_exps.bias where
        there are some) weighted as `route` says, plus the shared expert, times
        sigmoid(h . ffn_gate_inp_shexp) where it has that gate."""
        sel, wt = self.route(h, p)
        names = [p + f"ffn_{n}_exps" for n in ("gate", "up", "down")]
        G, U, D = (self.w64(x + ".weight") for x in names)
        B = [self.w64(x + ".bias") if self.has(x + ".bias") else np.zeros((self.n_expert, 1), self.dt)
             for x in names]
        out = np.zeros_like(h)
        for e in range(self.n_expert):
            rows, slots = np.nonzero(sel == e)
            if len(rows):
                y = self.gated(h[rows], G[e], U[e], D[e], [b[e] for b in B])
                out[rows] += wt[rows, slots][:, None] * y
        if self.has(p + "ffn_gate_shexp.weight"):
            sh = self.gated(h, *(self.w64(p + f"ffn_{n}_shexp.weight") for n in ("gate", "up", "down")))
            if self.has(p + "ffn_gate_inp_shexp.weight"):
                gs = h @ self.w64(p + "ffn_gate_inp_shexp.weight").reshape(-1)
                sh = (1.0 / (1.0 + np.exp(-gs)))[:, None] * sh
            out += sh
        return out

    def ffn(self, h: np.ndarray, p: str, L: int) -> np.ndarray:
        if self.n_expert and L >= self.n_dense_lead:
            return self.moe(h, p)
        if not self.has(p + "ffn_gate.weight"):   # phi3: ffn_up rows are gate then up
            y = self.lin(h, p + "ffn_up")
            if y.shape[1] != 2 * self.n_ff[L]:
                raise ValueError(f"layer {L}: fused ffn_up rows differ from 2 * feed_forward_length")
            gt, up = y[:, :self.n_ff[L]], y[:, self.n_ff[L]:]
        else:
            if self.w(p + "ffn_gate.weight").shape[0] != self.n_ff[L]:
                raise ValueError(f"layer {L}: ffn_gate rows differ from feed_forward_length")
            gt, up = self.lin(h, p + "ffn_gate"), self.lin(h, p + "ffn_up")
        if self.gemma:   # GELU, tanh approximation
            c = math.sqrt(2.0 / math.pi)
            act = 0.5 * gt * (1.0 + np.tanh(c * (gt + 0.044715 * gt ** 3)))
        else:
            act = gt / (self.dt.type(1) + np.exp(-gt))
        return self.lin(act * up, p + "ffn_down")

    def relu2_mlp(self, h: np.ndarray, p: str, L: int) -> np.ndarray:
        """nemotron_h's MLP layer (llama.cpp build_ffn, LLM_FFN_RELU_SQR, no gate): ffn_down
        relu(ffn_up h)^2, with the optional biases."""
        if self.w(p + "ffn_up.weight").shape[0] != self.n_ff[L]:
            raise ValueError(f"layer {L}: ffn_up rows differ from feed_forward_length")
        u = np.maximum(self.lin(h, p + "ffn_up"), 0.0)
        return self.lin(u * u if self.relu_sq else u, p + "ffn_down")

    def mla_latent(self, h: np.ndarray, p: str, theta: np.ndarray, L: int):
        """deepseek2's latent attention inputs: (q_nope [n][n_head][nope], q_pe [n][n_head][rope],
        c [n][kv_lora], k_pe [n][1][rope]).  The query is W_q h, or W_q_b rmsnorm(W_q_a h), per head
        q_nope | q_pe; W_kv_a_mqa h is the latent c (RMS-normed by attn_kv_a_norm) | k_pe, one
        rope part all heads share; both rope parts rotated."""
        n, nh = len(h), self.n_heads[L]
        nope = self.head_k - self.n_rot
        if self.has(p + "attn_q_a.weight"):
            q = self.lin(self.rmsnorm(self.lin(h, p + "attn_q_a"), p + "attn_q_a_norm.weight"), p + "attn_q_b")
        else:
            q = self.lin(h, p + "attn_q")
        q = q.reshape(n, nh, self.head_k)
        kv = self.lin(h, p + "attn_kv_a_mqa")
        c = self.rmsnorm(kv[:, :self.kv_lora], p + "attn_kv_a_norm.weight")
        return q[:, :, :nope], self.rope(q[:, :, nope:], theta), c, self.rope(kv[:, None, self.kv_lora:], theta)

    def mla_attend(self, h: np.ndarray, p: str, theta: np.ndarray, L: int) -> np.ndarray:
        """deepseek2's latent attention decompressed into multi-head attention: head j's key is
        (k_b[j]^T c) | k_pe, its value v_b[j] c; scores scale by 1/sqrt(key_length_mla).  The
        heads' outputs [n][n_head * value_length_mla]."""
        q_nope, q_pe, c, k_pe = self.mla_latent(h, p, theta, L)
        n, nh = q_nope.shape[:2]
        k_nope = np.einsum("jlc,nl->njc", self.w64(p + "attn_k_b.weight"), c)     # [n][nh][nope]
        v = np.einsum("jvl,nl->njv", self.w64(p + "attn_v_b.weight"), c)          # [n][nh][v]
        q = np.concatenate([q_nope, q_pe], axis=-1)
        k = np.concatenate([k_nope, np.broadcast_to(k_pe, (n, nh, self.n_rot))], axis=-1)
        return self.attend(q, k, v, L)

    def attend(self, q, k, v, L: int, q0: int = 0) -> np.ndarray:
        """Heads' outputs [n][n_head * v's head size].  gpt-oss's attn_sinks: per head a logit
        that joins each row's softmax (its denominator) without a value.  q0: the first query's
        position when k and v hold q0 earlier positions too (a continued State)."""
        n, nh, hd = q.shape
        group = nh // k.shape[1]
        kh = np.repeat(k, group, axis=1)  # head j uses kv head j // group
        vh = np.repeat(v, group, axis=1)
        s = np.einsum("qhd,khd->hqk", q * self.dt.type(self.q_scale), kh)
        if self.attn_cap:
            s = np.tanh(s / self.attn_cap) * self.attn_cap
        i, j = q0 + np.arange(n)[:, None], np.arange(k.shape[0])[None, :]
        masked = j > i
        if self.window[L]:
            masked |= (i - j) >= self.window[L]   # llama.cpp is_masked_swa (standard)
        if self.kv_budget:   # (sinks S, recent R, block size bs): kvant's KV budget (sinks policy)
            S, R, bs = self.kv_budget
            lo = i - R + 1
            wb = np.maximum(np.where(lo > 0, lo // bs, 0), S // bs)
            masked |= (j >= S) & (j < wb * bs)
        sink = f"blk.{L}.attn_sinks.weight"
        if self.has(sink) and (self.h2o or self.snapkv):
            raise ValueError("attention sinks with the h2o / snapkv policies are not in the reference")
        if self.h2o and n > self.h2o["prompt"]:
            pr = self._h2o_probs(s, group, n)
            return np.einsum("hqk,khd->qhd", pr, vh).reshape(n, -1)
        if self.snapkv and n > self.snapkv["prompt"]:
            masked = self._snap_mask(s, masked, group, n)
        s = s + np.where(masked, -np.inf, 0.0).astype(self.dt)
        sk = self.w64(sink).reshape(-1, 1, 1) if self.has(sink) else self.dt.type(-np.inf)
        mx = np.maximum(s.max(axis=-1, keepdims=True), sk)
        pr = np.exp(s - mx)
        pr /= pr.sum(axis=-1, keepdims=True) + np.exp(sk - mx)
        return np.einsum("hqk,khd->qhd", pr, vh).reshape(n, -1)

    def snap_keep(self, s: np.ndarray, group: int) -> list[np.ndarray]:
        """SnapKV: per KV head, the positions kept: the observation window's causal attention
        probabilities over [0, n) summed over its queries and the head's query heads, max-pooled
        (kernel `pool`, clipped at the ends), the `keep` highest (ties: the lower position)."""
        c = self.snapkv
        lp, f, nc = c["prompt"], c["obs_from"], c["n"]
        rows = s[:, f:lp, :lp]                                  # [nh][obs][lp] logits
        qi = np.arange(f, lp)[:, None]
        rows = np.where(np.arange(lp)[None, :] > qi, -np.inf, rows)
        rows = rows - rows.max(-1, keepdims=True)
        pr = np.exp(rows)
        pr /= pr.sum(-1, keepdims=True)
        tot = pr.sum(1)[:, :nc]                                 # [nh][nc]
        tot = tot.reshape(-1, group, nc).sum(1)                 # [nkv][nc]
        half = c["pool"] // 2
        pad = np.pad(tot, ((0, 0), (half, half)), constant_values=0.0)
        pooled = np.stack([pad[:, i:i + nc] for i in range(c["pool"])]).max(0)
        k = c["keep"]
        for row in pooled:   # the selection's margin: 0 (a tie, broken alike) or relative
            v = np.sort(row)[::-1]
            self.snap_gaps.append(0.0 if v[k - 1] == v[k] else float((v[k - 1] - v[k]) / v[k - 1]))
        return [np.sort(np.lexsort((np.arange(nc), -row))[:c["keep"]]) for row in pooled]

    def _gap(self, v: np.ndarray, k: int) -> None:
        v = np.sort(v)[::-1]
        self.snap_gaps.append(0.0 if v[k - 1] == v[k] else float((v[k - 1] - v[k]) / v[k - 1]))

    def _h2o_probs(self, s: np.ndarray, group: int, n: int) -> np.ndarray:
        """h2o, row by row: the prompt causal, its every token's probabilities summed per KV head;
        at its end the `keep` highest positions before the window are kept (ties: the lower);
        a later row i reads the kept positions and [wb(i) bs, i], wb(i) = max(S, (i - R + 1) //
        bs) (plain causal while wb(i) <= S), adds its probabilities; each block leaving the window
        is merged: of the kept (slot order) and the block's rows, the `keep` highest stay (ties:
        the lower index), a kept one in its slot, the block's entering the freed slots in order."""
        c = self.h2o
        lp, keep, R, bs, S = c["prompt"], c["keep"], c["recent"], c["bs"], c["sink_blocks"]
        nh = s.shape[0]
        nkv = nh // group
        pr = np.zeros_like(s)
        causal = np.arange(n)[None, :] > np.arange(lp)[:, None]
        x = np.where(causal[None], -np.inf, s[:, :lp, :])
        x = np.exp(x - x.max(-1, keepdims=True))
        pr[:, :lp, :] = x / x.sum(-1, keepdims=True)
        acc = pr[:, :lp, :].sum(1).reshape(nkv, group, n).sum(1)      # [nkv][n] by position

        def first(m: int) -> int:
            lo = m - R + 1
            return max(S, lo // bs if lo > 0 else 0)

        wb = first(lp)
        if wb > S:
            heavy = []
            for kh in range(nkv):
                self._gap(acc[kh, :wb * bs], keep)
                heavy.append(np.sort(np.lexsort((np.arange(wb * bs), -acc[kh, :wb * bs]))[:keep]))
            slot = [acc[kh, heavy[kh]].copy() for kh in range(nkv)]
            own = True
        else:
            heavy = [np.arange(keep) for _ in range(nkv)]
            slot = [None] * nkv
            own = False
        for i in range(lp, n):
            wi = first(i)
            for h in range(nh):
                kh = h // group
                cols = np.arange(i + 1) if wi <= S else np.concatenate([heavy[kh], np.arange(wi * bs, i + 1)])
                z = s[h, i, cols]
                z = np.exp(z - z.max())
                z /= z.sum()
                pr[h, i, cols] = z
                if own:
                    slot[kh] += z[:keep]
                    acc[kh, wi * bs:i + 1] += z[keep:]
                else:
                    acc[kh, cols] += z
            while wb < first(i + 1):
                for kh in range(nkv):
                    sc = slot[kh] if own else acc[kh, :keep].copy()
                    cand = np.concatenate([sc, acc[kh, wb * bs:(wb + 1) * bs]])
                    pos = np.concatenate([heavy[kh], np.arange(wb * bs, (wb + 1) * bs)])
                    self._gap(cand, keep)
                    chosen = np.sort(np.lexsort((np.arange(len(cand)), -cand))[:keep])
                    stay = set(int(x) for x in chosen if x < keep)
                    enter = iter(int(x) for x in chosen if x >= keep)
                    pick = np.array([j if j in stay else next(enter) for j in range(keep)])
                    heavy[kh], slot[kh] = pos[pick], cand[pick]
                own = True
                wb += 1
        return pr

    def _snap_mask(self, s: np.ndarray, masked: np.ndarray, group: int, n: int) -> np.ndarray:
        """Per head mask: the prompt's rows causal; a later row i reads the kept positions of its
        KV head and [wb(i) * bs, i], wb(i) = floor((i - recent + 1) / bs)."""
        c = self.snapkv
        keep = self.snap_keep(s, group)
        nh = s.shape[0]
        m = np.broadcast_to(masked, (nh, n, n)).copy()
        lp, bs = c["prompt"], c["bs"]
        for i in range(lp, n):
            wb = max((i - c["recent"] + 1) // bs, 0)
            row = np.ones(n, dtype=bool)
            row[wb * bs:i + 1] = False
            for h in range(nh):
                r = row.copy()
                r[keep[h // group]] = False
                m[h, i] = r
        return m

    # ---- the hybrids' recurrent layers ----
    def conv(self, u: np.ndarray, w: np.ndarray, L: int, state: State | None) -> np.ndarray:
        """Causal depthwise convolution (ggml_ssm_conv): out[t][ch] = sum_k pad[t + k][ch] w[ch][k]
        where pad is the d_conv - 1 previous rows (zeros before the sequence) then u; w [ch][d_conv],
        its last tap on the current row.  Token by token, or ssm_chunk rows at a time."""
        K = w.shape[1]
        prev = state.conv.get(L) if state is not None else None
        if prev is None:
            prev = np.zeros((K - 1, u.shape[1]), dtype=self.dt)
        out = np.empty_like(u)
        step = self.ssm_chunk or 1
        for c0 in range(0, len(u), step):
            pad = np.concatenate([prev, u[c0:c0 + step]])
            m = len(pad) - (K - 1)
            out[c0:c0 + m] = sum(pad[k:k + m] * w[:, k] for k in range(K))
            prev = pad[m:]
        if state is not None:
            state.conv[L] = prev
        return out

    def shortconv(self, h: np.ndarray, p: str, L: int, state: State | None) -> np.ndarray:
        """lfm2's recurrent layer: b | c | x = in_proj h, out_proj (c * conv(b * x))."""
        w = self.w64(p + "shortconv.conv.weight")
        if w.shape[1] != self.d_conv:
            raise ValueError(f"layer {L}: shortconv.conv has {w.shape[1]} taps, l_cache is {self.d_conv}")
        b, c, x = np.split(self.lin(h, p + "shortconv.in_proj"), 3, axis=1)
        return self.lin(c * self.conv(b * x, w, L, state), p + "shortconv.out_proj")

    def mamba2(self, h: np.ndarray, p: str, L: int, state: State | None) -> np.ndarray:
        """granitehybrid's recurrent layer (llama.cpp build_mamba2_layer): ssm_in h gives
        z [d_inner] | xBC [d_inner + 2 groups d_state] | dt [n_head]; xBC = silu(conv(xBC) + bias)
        splits into x (heads of d_inner / n_head), B and C ([group][d_state]); dt = softplus(dt +
        ssm_dt.bias); head h reads group h // (n_head / n_group); the scan (ssm_scan or ssd) gives
        y, plus D x; y * silu(z); an RMS norm over each group's d_inner / n_group values with
        ssm_norm's row; ssm_out y."""
        n = len(h)
        di, G, N, H = self.d_inner, self.n_group, self.d_state, self.n_ssm_head
        P = di // H
        zxbcdt = self.lin(h, p + "ssm_in")
        z, xbc, dt = zxbcdt[:, :di], zxbcdt[:, di:2 * di + 2 * G * N], zxbcdt[:, 2 * di + 2 * G * N:]
        xbc = self.conv(xbc, self.w64(p + "ssm_conv1d.weight"), L, state)
        if self.has(p + "ssm_conv1d.bias"):
            xbc = xbc + self.w64(p + "ssm_conv1d.bias")
        xbc = silu(xbc)
        x = xbc[:, :di].reshape(n, H, P)
        grp = np.arange(H) // (H // G)
        B = xbc[:, di:di + G * N].reshape(n, G, N)[:, grp]         # [n][H][N]
        C = xbc[:, di + G * N:].reshape(n, G, N)[:, grp]
        dt = softplus(dt + self.w64(p + "ssm_dt.bias").reshape(-1))  # [n][H]
        A = self.w64(p + "ssm_a").reshape(-1)
        s = state.ssm.get(L) if state is not None else None
        if s is None:
            s = np.zeros((H, P, N), dtype=self.dt)
        scan = self.ssd if self.ssm_chunk else self.ssm_scan
        y, s = scan(x, dt, A, B, C, s)
        if state is not None:
            state.ssm[L] = s
        y = (y + self.w64(p + "ssm_d").reshape(H, 1) * x).reshape(n, di)
        if self.ssm_gate:
            y = y * silu(z)
        ng = self.ssm_norm_groups or G
        yg = y.reshape(n, ng, di // ng)
        yg = yg / np.sqrt(np.mean(yg * yg, axis=-1, keepdims=True) + self.dt.type(self.eps))
        y = yg.reshape(n, di) * self.w64(p + "ssm_norm.weight").reshape(-1)
        return self.lin(y, p + "ssm_out")

    @staticmethod
    def ssm_scan(x, dt, A, B, C, s):
        """The Mamba-2 recurrence, token by token: s[h][p][n] = s dA[h] + B[h][n] x[h][p] dt[h] with
        dA = exp(dt A[h]); y[h][p] = sum_n s[h][p][n] C[h][n].  x [n][H][P], dt [n][H], B, C
        [n][H][N] (each head's group), s [H][P][N]; returns (y [n][H][P], the last s)."""
        y = np.empty_like(x)
        for t in range(len(x)):
            s = s * np.exp(dt[t] * A)[:, None, None] + \
                (x[t] * dt[t][:, None])[:, :, None] * B[t][:, None, :]
            y[t] = np.einsum("hpn,hn->hp", s, C[t])
        return y, s

    def ssd(self, x, dt, A, B, C, s):
        """ssm_scan in the chunked state-space-duality form, ssm_chunk tokens a chunk.  With
        a = dt A (log dA) and seg[t][u] = a[u+1] + .. + a[t] (the segment sum; -inf for u > t):
        inside a chunk y[t] = sum_{u <= t} exp(seg[t][u]) (C[t] . B[u]) dt[u] x[u] (a masked
        quadratic form, attention-like), plus the state entering the chunk decayed to t,
        exp(a[0] + .. + a[t]) C[t] . s; the state leaving it is s exp(sum a) plus each token's
        dt x B decayed to the chunk's end."""
        Q = self.ssm_chunk
        y = np.empty_like(x)
        for c0 in range(0, len(x), Q):
            sl = slice(c0, c0 + Q)
            xc, dtc, Bc, Cc = x[sl], dt[sl], B[sl], C[sl]
            m = len(xc)
            a = (dtc * A).T                                   # [H][m]
            # segment sums, the stable way: row t of the strictly-lower mask summed down the rows
            rows = np.where(np.tri(m, k=-1, dtype=bool), a[:, :, None], 0.0)   # [H][t][u]: a[t], t > u
            seg = np.cumsum(rows, axis=1)
            seg = np.where(np.tri(m, dtype=bool), seg, -np.inf)
            cb = np.einsum("thn,uhn->htu", Cc, Bc)
            y[sl] = np.einsum("htu,uh,uhp->thp", np.exp(seg) * cb, dtc, xc)
            cum = np.cumsum(a, axis=1)                        # [H][m]: a[0] + .. + a[t]
            y[sl] += np.exp(cum).T[:, :, None] * np.einsum("thn,hpn->thp", Cc, s)
            to_end = np.exp(cum[:, -1:] - cum)                # [H][m]: a[u+1] + .. + a[m-1]
            s = s * np.exp(cum[:, -1])[:, None, None] + \
                np.einsum("hu,uh,uhp,uhn->hpn", to_end, dtc, xc, Bc)
        return y, s

    def gdn(self, h: np.ndarray, p: str, L: int, state: State | None) -> np.ndarray:
        """qwen35's Gated DeltaNet layer (llama.cpp build_layer_attn_linear): qkv = attn_qkv h (rows
        q [n_k][D] | k [n_k][D] | v [n_v][D]), z = attn_gate h, beta = sigmoid(ssm_beta h),
        g = softplus(ssm_alpha h + ssm_dt.bias) ssm_a (log of the decay, per V head); qkv through the
        causal convolution ssm_conv1d (no bias) and silu; q and k L2-normalised per head
        (x / sqrt(sum x^2 + eps), eps the RMS eps: build_gdn_l2_norm); V head h reads K head
        h % n_k; q scaled by 1/sqrt(D); the delta rule (token by token, or chunked with ssm_chunk);
        each head's output RMS-normed with ssm_norm [D], times silu(z); ssm_out."""
        n = len(h)
        Hk, Hv, D = self.n_k_head, self.n_v_head, self.d_state
        one = self.dt.type(1)
        qkv = self.lin(h, p + "attn_qkv")
        z = self.lin(h, p + "attn_gate").reshape(n, Hv, D)
        beta = one / (one + np.exp(-self.lin(h, p + "ssm_beta")))                     # [n][Hv]
        g = softplus(self.lin(h, p + "ssm_alpha") + self.w64(p + "ssm_dt.bias").reshape(-1)) * \
            self.w64(p + "ssm_a").reshape(-1)                                         # [n][Hv]
        xc = silu(self.conv(qkv, self.w64(p + "ssm_conv1d.weight"), L, state))
        q = xc[:, :Hk * D].reshape(n, Hk, D)
        k = xc[:, Hk * D:2 * Hk * D].reshape(n, Hk, D)
        v = xc[:, 2 * Hk * D:].reshape(n, Hv, D)
        eps = self.dt.type(self.eps)
        if self.gdn_l2 == "head":
            q = q / np.sqrt(np.sum(q * q, axis=-1, keepdims=True) + eps)
            k = k / np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + eps)
        else:   # over the whole row (a wrong variant, for the tests)
            q = q / np.sqrt(np.sum(q * q, axis=(1, 2), keepdims=True) + eps)
            k = k / np.sqrt(np.sum(k * k, axis=(1, 2), keepdims=True) + eps)
        kh = np.arange(Hv) % Hk if self.gdn_kmap == "tile" else np.arange(Hv) // (Hv // Hk)
        q = q[:, kh] * self.dt.type(1.0 / math.sqrt(D) if self.gdn_q_scale else 1.0)
        k = k[:, kh]
        s = state.ssm.get(L) if state is not None else None
        if s is None:
            s = np.zeros((Hv, D, D), dtype=self.dt)
        rule = self.delta_chunked if self.ssm_chunk else self.delta_rule
        y, s = rule(q, k, v, g, beta, s)
        if state is not None:
            state.ssm[L] = s
        y = y / np.sqrt(np.mean(y * y, axis=-1, keepdims=True) + eps) * self.w64(p + "ssm_norm.weight").reshape(-1)
        if self.ssm_gate:
            y = y * silu(z)
        return self.lin(y.reshape(n, Hv * D), p + "ssm_out")

    @staticmethod
    def delta_rule(q, k, v, g, beta, s):
        """The gated delta rule, token by token, per V head: S = S exp(g); d = (v - S k) beta;
        S = S + d k^T; o = S q.  q, k [n][H][Dk], v [n][H][Dv], g, beta [n][H], s [H][Dv][Dk];
        returns (o [n][H][Dv], the last s)."""
        y = np.empty_like(v)
        for t in range(len(v)):
            s = s * np.exp(g[t])[:, None, None]
            d = (v[t] - np.einsum("hvk,hk->hv", s, k[t])) * beta[t][:, None]
            s = s + d[:, :, None] * k[t][:, None, :]
            y[t] = np.einsum("hvk,hk->hv", s, q[t])
        return y, s

    def delta_chunked(self, q, k, v, g, beta, s):
        """delta_rule in chunks of ssm_chunk tokens (the WY form, as llama.cpp's
        build_delta_net_chunking).  In a chunk, with G[t] = g[0] + .. + g[t] and S0 the state
        entering it, S[t] = exp(G[t]) S0 + sum_{u <= t} exp(G[t] - G[u]) w[u] k[u]^T where the
        updates w solve (I + A) w = beta v - beta exp(G) S0 k, A[t][u] = beta[t] exp(G[t] - G[u])
        k[t].k[u] for u < t (unit lower-triangular); then o[t] = exp(G[t]) S0 q[t] +
        sum_{u <= t} exp(G[t] - G[u]) (q[t].k[u]) w[u], and the state leaving the chunk is
        exp(G[-1]) S0 + sum_u exp(G[-1] - G[u]) w[u] k[u]^T."""
        Q = self.ssm_chunk
        y = np.empty_like(v)
        for c0 in range(0, len(v), Q):
            sl = slice(c0, c0 + Q)
            qc, kc, vc = (x[sl].transpose(1, 0, 2) for x in (q, k, v))   # [H][m][D]
            gc, bc = g[sl].T, beta[sl].T                                # [H][m]
            m = qc.shape[1]
            G = np.cumsum(gc, axis=1)
            incl = np.tri(m, dtype=bool)
            decay = np.exp(np.where(incl, G[:, :, None] - G[:, None, :], -np.inf))   # [H][t][u]
            A = np.where(np.tri(m, k=-1, dtype=bool),
                         bc[:, :, None] * decay * np.einsum("htd,hud->htu", kc, kc), 0.0)
            T = A + np.eye(m)
            eG = np.exp(G)
            rhs = bc[:, :, None] * vc - (bc * eG)[:, :, None] * np.einsum("huk,hvk->huv", kc, s)
            w = np.linalg.solve(T, rhs)                                  # [H][m][Dv]
            o = eG[:, :, None] * np.einsum("htk,hvk->htv", qc, s) + \
                np.einsum("htu,htu,huv->htv", decay, np.einsum("htd,hud->htu", qc, kc), w)
            y[sl] = o.transpose(1, 0, 2)
            s = np.exp(G[:, -1])[:, None, None] * s + \
                np.einsum("hu,huv,huk->hvk", np.exp(G[:, -1:] - G), w, kc)
        return y, s

    def forward(self, ids, drop_cache: bool = False, state: State | None = None) -> np.ndarray:
        """Teacher-forced logits [n][n_vocab] (float64), positions 0..n-1 from an empty cache, or
        n_past.. after what `state` holds (which the call then extends)."""
        ids = np.asarray(ids, dtype=np.int64)
        n = len(ids)
        if n == 0:
            return np.zeros((0, self.n_vocab))
        if ids.min() < 0 or ids.max() >= self.n_vocab:
            raise ValueError("token id out of range")
        if state is not None and (self.mla or self.kv_budget or self.snapkv or self.h2o):
            raise ValueError("a continued State is not in the reference for latent attention or the "
                             "KV policies")
        n0 = state.n_past if state is not None else 0
        x = self.w("token_embd.weight")[ids].astype(self.dt)
        if self.emb_scale != 1.0:
            x = x * self.dt.type(np.float32(self.emb_scale))
        pos = n0 + np.arange(n)
        res = self.dt.type(self.res_scale) if self.res_scale else None   # granite: x + s * branch
        for L in range(self.n_layer):
            p = f"blk.{L}."
            theta = self.rope_thetas(pos, self.base_l[L], self.scale_l[L]).astype(self.dt)
            nh, nkv = self.n_heads[L], self.n_heads_kv[L]
            h = self.rmsnorm(x, p + "attn_norm.weight")
            if self.recr[L]:
                mixer = {"lfm2": self.shortconv, "qwen35": self.gdn}.get(self.arch, self.mamba2)
                a = mixer(h, p, L, state)
            elif self.one_sublayer and self.n_ff[L]:
                a = self.relu2_mlp(h, p, L)
            else:
                if self.mla:
                    heads = self.mla_attend(h, p, theta, L)
                else:
                    gate = None
                    if self.q_gate:   # qwen35
                        q, gate, k, v = self.qkv_gated(h, p, nh, nkv)
                    else:
                        q, k, v = self.qkv(h, p, nh, nkv)
                    if self.has(p + "attn_q_norm.weight") and self.w(p + "attn_q_norm.weight").size != self.head_dim:
                        q = self.rmsnorm(q.reshape(len(ids), -1), p + "attn_q_norm.weight").reshape(q.shape)
                        k = self.rmsnorm(k.reshape(len(ids), -1), p + "attn_k_norm.weight").reshape(k.shape)
                    elif self.has(p + "attn_q_norm.weight"):   # per-head RMS norm before rope
                        q = self.rmsnorm(q, p + "attn_q_norm.weight")
                        k = self.rmsnorm(k, p + "attn_k_norm.weight")
                    if self.use_rope:
                        q, k = self.rope(q, theta), self.rope(k, theta)
                    if state is not None:
                        if L in state.kv:
                            k = np.concatenate([state.kv[L][0], k])
                            v = np.concatenate([state.kv[L][1], v])
                        state.kv[L] = (k, v)
                    heads = self.attend(q, k, v, L, n0)
                    if gate is not None and self.attn_gate:   # qwen35: heads * sigmoid(gate)
                        heads = heads / (self.dt.type(1) + np.exp(-gate.reshape(heads.shape)))
                a = self.lin(heads, p + "attn_output")
            if self.gemma:
                a = self.rmsnorm(a, p + "post_attention_norm.weight")
            x = x + (a if res is None else res * a)
            if not self.one_sublayer:
                f = self.ffn(self.rmsnorm(x, p + self.ffn_norm), p, L)
                if self.gemma:
                    f = self.rmsnorm(f, p + "post_ffw_norm.weight")
                x = x + (f if res is None else res * f)
            if drop_cache:
                for key in [k_ for k_ in self._cache if k_.startswith(p)]:
                    del self._cache[key]
        if state is not None:
            state.n_past += n
        x = self.rmsnorm(x, self.out_norm)
        out_name = "output.weight" if self.has("output.weight") else "token_embd.weight"
        # chunk over vocab to bound f64 memory
        W = self.w(out_name)
        logits = np.empty((n, self.n_vocab), dtype=self.dt)
        step = 8192
        for a in range(0, self.n_vocab, step):
            logits[:, a:a + step] = x @ W[a:a + step].astype(self.dt).T
        if self.final_cap:
            logits = np.tanh(logits / self.final_cap) * self.final_cap
        if self.logit_scale:   # granite: llama.cpp scales by 1 / logit_scale
            logits = logits / self.logit_scale
        return logits


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """||a - b|| / ||b|| in float64 (a: kvant's float32 logits, b: the reference)."""
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


def check_argmax(kv: np.ndarray, ref: np.ndarray) -> tuple[int, list[str]]:
    """(#positions where kvant's argmax is the reference's, unacceptable disagreements).  A
    differing argmax is accepted only for a near-tie: the reference gap between the two
    candidates below 4x that row's max abs error."""
    ka, ra = kv.argmax(-1), ref.argmax(-1)
    bad = []
    for p in np.nonzero(ka != ra)[0]:
        gap = ref[p, ra[p]] - ref[p, ka[p]]
        tol = 4.0 * float(np.abs(kv[p].astype(np.float64) - ref[p]).max())
        if gap > tol:
            bad.append(f"pos {p}: kvant argmax {ka[p]} ref argmax {ra[p]} (ref gap {gap:.3g} > tol {tol:.3g})")
    return int((ka == ra).sum()), bad


def ref_logits(path: str, ids, rope_mode: str | None = None, dtype=np.float64) -> np.ndarray:
    return RefModel(path, rope_mode=rope_mode, dtype=dtype).forward(ids, drop_cache=True)


def nll(logits: np.ndarray, ids) -> np.ndarray:
    """Negative log-likelihood of ids[1:] given logits[:-1]."""
    ids = np.asarray(ids)
    lg = logits[:-1]
    m = lg.max(axis=-1, keepdims=True)
    lse = (m + np.log(np.exp(lg - m).sum(axis=-1, keepdims=True)))[:, 0]
    return lse - lg[np.arange(len(ids) - 1), ids[1:]]


# ---- approximate GPT-2 style byte-level BPE (self-checks only) ----
def _bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_PRE = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d| ?[^\s\w]+|\s+(?!\S)|\s+""")


def approx_tokenize(path: str, text: str) -> list[int]:
    r = GGUFReader(path)
    toks = _field(r, "tokenizer.ggml.tokens")
    merges = _field(r, "tokenizer.ggml.merges") or []
    vocab = {t: i for i, t in enumerate(toks)}
    ranks = {tuple(m.split(" ", 1)): i for i, m in enumerate(merges)}
    b2u = _bytes_to_unicode()
    out: list[int] = []
    for word in _PRE.findall(text):
        parts = [b2u[b] for b in word.encode("utf-8")]
        while len(parts) > 1:
            best = min(range(len(parts) - 1), key=lambda i: ranks.get((parts[i], parts[i + 1]), 1 << 30))
            if (parts[best], parts[best + 1]) not in ranks:
                break
            parts[best:best + 2] = [parts[best] + parts[best + 1]]
        out.extend(vocab[p] for p in parts)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--tokens", help="comma/space separated token ids")
    ap.add_argument("--tokens-file")
    ap.add_argument("--text-file", help="tokenize with approx_tokenize (self-check only)")
    ap.add_argument("-n", type=int, default=0, help="use only the first N tokens")
    ap.add_argument("--out", help="write logits .npy (float64) or .f32 (raw float32)")
    ap.add_argument("--rope", choices=[ROPE_NORMAL, ROPE_NEOX], help="override the rope convention")
    ap.add_argument("--f32", action="store_true", help="compute in float32 (error estimate only)")
    ap.add_argument("--ssm-chunk", type=int, default=0,
                    help="hybrids: recurrent layers in chunks of N tokens (0: token by token)")
    ap.add_argument("--ppl", type=int, default=0, help="print perplexity over chunks of this size")
    ap.add_argument("--generate", type=int, default=0, help="greedy-continue N tokens and print ids/text")
    a = ap.parse_args(argv)
    if a.tokens is not None:
        ids = [int(t) for t in re.split(r"[,\s]+", a.tokens.strip()) if t]
    elif a.tokens_file:
        ids = [int(t) for t in open(a.tokens_file).read().split()]
    elif a.text_file:
        ids = approx_tokenize(a.model, open(a.text_file, encoding="utf-8").read())
    else:
        ap.error("need --tokens, --tokens-file or --text-file")
    if a.n:
        ids = ids[: a.n]
    m = RefModel(a.model, rope_mode=a.rope, dtype=np.float32 if a.f32 else np.float64, ssm_chunk=a.ssm_chunk)
    if a.ppl:
        tot, cnt = 0.0, 0
        for s in range(0, len(ids) - 1, a.ppl):
            chunk = ids[s:s + a.ppl]
            if len(chunk) < 2:
                break
            l = nll(m.forward(chunk), chunk)
            tot += l.sum()
            cnt += len(l)
            print(f"chunk {s // a.ppl}: ppl so far {math.exp(tot / cnt):.3f}", flush=True)
        print(f"perplexity ({m.rope_mode} rope, {cnt} predictions): {math.exp(tot / cnt):.4f}")
        return 0
    if a.generate:
        seq = list(ids)
        for _ in range(a.generate):
            seq.append(int(np.argmax(m.forward(seq)[-1])))
        toks = _field(m.reader, "tokenizer.ggml.tokens")
        u2b = {v: k for k, v in _bytes_to_unicode().items()}
        gen = seq[len(ids):]
        txt = bytes(u2b.get(ch, 63) for i in gen for ch in toks[i]).decode("utf-8", "replace")
        print("ids:", gen)
        print("text:", repr(txt))
        return 0
    lg = m.forward(ids)
    if a.out:
        if a.out.endswith(".f32"):
            lg.astype("<f4").tofile(a.out)
        else:
            np.save(a.out, lg)
    else:
        print("argmax:", lg.argmax(-1).tolist())
    return 0


if __name__ == "__main__":
    sys.exit(main())
