/* models/remat.h: rematerialisation policies, MaxText's names (MaxText
 * src/MaxText/layers/decoders.py, Decoder.get_remat_policy).
 *
 * A policy gives every named tensor of a decoder layer an action: keep it on the
 * device from the forward to the backward, recompute it in the backward (remat), or
 * copy it to host memory in the forward and back before the layer's backward
 * (offload). The tensors are the RT rows of MT_LAYER_TENSORS below, the policies the
 * rows of MT_REMAT_POLICIES: full keeps only decoder_layer_input, minimal_with_context
 * (meshtrain's default) keeps everything, custom reads each name from its own key. */
#ifndef MT_MODELS_REMAT_H
#define MT_MODELS_REMAT_H

#include <stddef.h>
#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The one list of a decoder layer's saved tensors, in the order the model plans them:
 * the "layers.<l>.<name>" plan entries, plan tags, activation probes, the remat names and
 * the remat_policy=custom config keys all expand it. Two kinds of row:
 *   LT(ID, "name")                   a tensor without a remat name of its own (the norm
 *                                    statistics, always kept; context_lse goes with context)
 *   RT(ID, "name", DEFAULT, "doc")   one of MaxText's nine remat names (MaxText
 *                                    layers/decoders.py and layers/attentions.py
 *                                    checkpoint_name calls); DEFAULT its action under
 *                                    remat_policy=custom (DEVICE | REMAT), "doc" its key's text
 * Shapes: N tokens of the micro-batch (batch x sequence), D model width, H / Hkv query /
 * key-value heads, Dh head_dim, F MLP width, B batch, T sequence. The norm rows are
 * rstd: input_layernorm, q_norm and k_norm per head, the post-attention, pre-MLP and
 * post-feedforward norms (gemma2/3). */
#define MT_LAYER_TENSORS(LT, RT)                                                          \
    RT(DECODER_LAYER_INPUT, "decoder_layer_input", DEVICE, /* [N, D] */                   \
       "remat_policy=custom: layer input (device only: the backward recomputes from it)") \
    LT(INPUT_NORM_RSTD, "input_norm_rstd") /* input_layernorm rstd [N] */                 \
    LT(QUERY_NORM_RSTD, "query_norm_rstd") /* q_norm rstd [N*H] (qk-norm) */              \
    LT(KEY_NORM_RSTD, "key_norm_rstd") /* k_norm rstd [N*Hkv] (qk-norm) */                \
    RT(QUERY_PROJ, "query_proj", REMAT, /* [N, H*Dh] */                                   \
       "remat_policy=custom: q after projection, QK-norm, RoPE")                          \
    RT(KEY_PROJ, "key_proj", REMAT, /* [N, Hkv*Dh] */                                     \
       "remat_policy=custom: k after projection, QK-norm, RoPE")                          \
    RT(VALUE_PROJ, "value_proj", REMAT, /* [N, Hkv*Dh] */                                 \
       "remat_policy=custom: v projection")                                               \
    RT(CONTEXT, "context", REMAT, /* [N, H*Dh] */                                         \
       "remat_policy=custom: attention output + logsumexp")                               \
    LT(CONTEXT_LSE, "context_lse") /* [B, H, T], remat name context */                    \
    RT(OUT_PROJ, "out_proj", REMAT, /* [N, D] */                                          \
       "remat_policy=custom: o_proj output")                                              \
    LT(POST_ATTN_NORM_RSTD, "post_attn_norm_rstd") /* [N] (gemma2/3) */                   \
    LT(PRE_MLP_NORM_RSTD, "pre_mlp_norm_rstd") /* [N] */                                  \
    RT(MLPWI_0, "mlpwi_0", REMAT, /* [N, F] */                                            \
       "remat_policy=custom: gate projection (before activation)")                        \
    RT(MLPWI_1, "mlpwi_1", REMAT, /* [N, F] */                                            \
       "remat_policy=custom: up projection")                                              \
    RT(MLPWO, "mlpwo", REMAT, /* [N, D] */                                                \
       "remat_policy=custom: MLP output (saved with a post-MLP norm)")                    \
    LT(POST_FFW_NORM_RSTD, "post_ffw_norm_rstd") /* [N] */

#define MT_REMAT_ROW_SKIP_(...)
#define MT_LT_ENUM_(id, ...) MT_LT_##id,
#define MT_RT_ENUM_(id, ...) MT_RT_##id,

/* MaxText's nine remat names (the RT rows of MT_LAYER_TENSORS, in its order). */
typedef enum mt_remat_tensor { MT_LAYER_TENSORS(MT_REMAT_ROW_SKIP_, MT_RT_ENUM_) MT_RT_COUNT } mt_remat_tensor;

/* Every tensor a decoder layer saves for its backward (every row of MT_LAYER_TENSORS).
 * The nine remat names are a subset, mapped by mt_layer_tensor_remat. */
typedef enum mt_layer_tensor { MT_LAYER_TENSORS(MT_LT_ENUM_, MT_LT_ENUM_) MT_LT_COUNT } mt_layer_tensor;

/* Name of layer tensor t ("decoder_layer_input", "input_norm_rstd", ...), NULL when
 * out of range. */
const char *mt_layer_tensor_name(mt_layer_tensor t);

/* The remat name layer tensor t belongs to (context_lse: context), or -1 for the norm
 * statistics, which are always kept (N floats each; recomputing them would need their
 * inputs) and for t out of range. */
int mt_layer_tensor_remat(mt_layer_tensor t);

/* Ordered so that a larger value keeps more on the device (MaxText's estimator
 * order remat < offload < device). */
typedef enum mt_remat_action { MT_RA_REMAT = 0, MT_RA_OFFLOAD = 1, MT_RA_DEVICE = 2 } mt_remat_action;

/* The policies: X(ID, "name", actions), actions one letter per remat name in
 * mt_remat_tensor order (input, q, k, v, context, out_proj, mlpwi_0, mlpwi_1, mlpwo):
 * D device, R remat, O offload (MaxText layers/decoders.py get_remat_policy; custom:
 * each name from its own key). */
#define MT_REMAT_POLICIES(X)                                                             \
    X(FULL, "full", "DRRRRRRRR")                                                         \
    X(MINIMAL, "minimal", "DDDDRDDDD")                                                   \
    X(MINIMAL_WITH_CONTEXT, "minimal_with_context", "DDDDDDDDD")                         \
    X(SAVE_DOT_WITH_CONTEXT_EXCEPT_MLP, "save_dot_with_context_except_mlp", "DDDDDDRRR") \
    X(SAVE_DOT_EXCEPT_MLPWI, "save_dot_except_mlpwi", "DDDDRDRRD")                       \
    X(SAVE_DOT_EXCEPT_MLP, "save_dot_except_mlp", "DDDDRDRRR")                           \
    X(SAVE_QKV_PROJ, "save_qkv_proj", "DDDDRRRRR")                                       \
    X(SAVE_OUT_PROJ, "save_out_proj", "DRRRRDRRR")                                       \
    X(QKV_PROJ_OFFLOADED, "qkv_proj_offloaded", "DOOORRRRR")                             \
    X(MINIMAL_OFFLOADED, "minimal_offloaded", "DOOOROOOO")                               \
    X(CUSTOM, "custom", NULL)

#define MT_REMAT_POLICY_ENUM_(id, ...) MT_REMAT_##id,
typedef enum mt_remat_policy_kind {
    MT_REMAT_POLICIES(MT_REMAT_POLICY_ENUM_) MT_REMAT_POLICY_COUNT
} mt_remat_policy_kind;

/* The resolved action of every named tensor. */
typedef struct mt_remat_policy {
    mt_remat_action action[MT_RT_COUNT];
} mt_remat_policy;

/* MaxText names: "decoder_layer_input", ... ; "remat" | "offload" | "device";
 * "full", ... NULL when out of range. */
const char *mt_remat_tensor_name(mt_remat_tensor t);
const char *mt_remat_action_name(mt_remat_action a);
const char *mt_remat_policy_name(mt_remat_policy_kind k);

/* Parse a name. Errors: MT_ERR_INVALID naming the text and listing the allowed
 * names. */
mt_status mt_remat_tensor_parse(const char *s, mt_remat_tensor *out);
mt_status mt_remat_action_parse(const char *s, mt_remat_action *out);
mt_status mt_remat_policy_parse(const char *s, mt_remat_policy_kind *out);

/* The actions of policy k; for MT_REMAT_CUSTOM the actions are `custom` (may be
 * NULL: then every name is remat except decoder_layer_input = device).
 * Errors: MT_ERR_INVALID when k is out of range, or decoder_layer_input is not
 * device (meshtrain always keeps each layer's input; the backward recomputes
 * everything else from it). */
mt_status mt_remat_policy_resolve(mt_remat_policy_kind k, const mt_remat_action *custom,
                                  mt_remat_policy *out);

/* A policy keeping everything on the device (minimal_with_context). */
mt_remat_policy mt_remat_policy_keep_all(void);

/* Human form "query_proj=device,key_proj=remat,..." of the eight names other than
 * decoder_layer_input, into buf[n]; returns buf. */
const char *mt_remat_policy_str(const mt_remat_policy *p, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
