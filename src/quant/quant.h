/* quant.h - weight quantization: choosing a target type for a tensor,
 * converting a tensor between types row by row, and the importance-
 * weighted quantizer used with calibration statistics.
 *
 * RTN ("round to nearest") is the reference from_float of dtype.h.  With
 * importance weights imp[ne0] (mean x^2 of the input column, from
 * quant_calib), q4_0 / q4_1 / q5_0 / q8_0 blocks pick the scale (and min)
 * minimising sum_i imp_i * sqrt(s2 + w_i^2) * (w_i - q_i)^2 over a small
 * grid around the RTN scale, each candidate refined by weighted least
 * squares (the llama.cpp imatrix recipe); other types ignore imp.
 *
 * Threading: pure functions over caller memory; any thread.
 */
#ifndef KVANT_QUANT_H
#define KVANT_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

/* Parses a target type name ("q8_0", "Q4_K", "f16", ...).  Returns the
 * dtype, or KV_EINVAL (negative) with the supported names in err. */
int quant_parse_type(const char *name, kvant_err *err);

/* 1 when a tensor named name with n_dims dims is a weight matrix that
 * quantization applies to (2-D, not a norm, not rope_freqs). */
int quant_is_matrix(const char *name, uint32_t n_dims);

/* type if rows of ne0 elements fit its blocks, else a fallback that does
 * (q8_0 / f16); *fell_back set to 1 when it changed. */
uint32_t quant_fit_type(uint32_t type, int64_t ne0, int *fell_back);

/* Recipe "q4_k_m" (llama.cpp-like mixed precision) for tensor name with
 * row length ne0 in a model of n_layers: q6_K for token_embd/output and
 * for attn_v / ffn_down in the first and last eighth of the layers and
 * every third layer between; q4_K elsewhere.  Where a row does not fit
 * 256-blocks, q6_K -> q5_0 and q4_K -> q4_0 (keeps the recipe under
 * ~5 bits/weight).  Returns -1 for an unknown recipe name. */
int quant_recipe_type(const char *recipe, const char *name, int64_t ne0, int n_layers);

/* 1 when imp changes how type is quantized. */
int quant_type_uses_imp(uint32_t type);

/* Converts nrows rows of ne0 elements from (src_type, src) to (dst_type,
 * dst): dequantize with to_float, quantize with the reference RTN, or with
 * the importance-weighted search when imp [ne0] is not NULL.  tmp is
 * [ne0] floats of scratch.  ne0 must fit both types (quant_fit_type). */
void quant_convert(uint32_t src_type, const void *src, uint32_t dst_type, void *dst, int64_t ne0,
                   int64_t nrows, const float *imp, float *tmp);

/* Importance-weighted quantization of one row (n a multiple of the block
 * size) into dst of quant_type_uses_imp(type); imp may be NULL (uniform). */
void quant_row_imp(uint32_t type, const float *x, const float *imp, void *dst, int64_t n);

#endif
