/* models/remat.h: rematerialisation policies, MaxText's names (MaxText
 * src/MaxText/layers/decoders.py, Decoder.get_remat_policy).
 *
 * A policy gives every named tensor of a decoder layer an action: keep it on the
 * device from the forward to the backward, recompute it in the backward (remat), or
 * copy it to host memory in the forward and back before the layer's backward
 * (offload). Names and where each sits (MaxText layers/decoders.py and
 * layers/attentions.py checkpoint_name calls):
 *   decoder_layer_input  the layer's input x [N, D] (always kept on the device here)
 *   query_proj           q [N, H*Dh] after projection, QK-norm and RoPE
 *   key_proj             k [N, Hkv*Dh] after projection, QK-norm and RoPE
 *   value_proj           v [N, Hkv*Dh]
 *   context              attention output [N, H*Dh] plus its logsumexp [B, H, T]
 *   out_proj             o_proj output [N, D]
 *   mlpwi_0              gate projection before the activation [N, F]
 *   mlpwi_1              up projection [N, F]
 *   mlpwo                MLP output [N, D] (saved only by models with a post-MLP norm;
 *                        other models never need it in the backward)
 * Policies (MaxText remat_policy, layers/decoders.py get_remat_policy):
 *   full                           nothing but decoder_layer_input
 *   minimal                        q, k, v, out_proj, mlpwi_0, mlpwi_1, mlpwo
 *   minimal_with_context           minimal + context (everything: meshtrain's default)
 *   save_dot_with_context_except_mlp   q, k, v, context, out_proj
 *   save_dot_except_mlpwi          q, k, v, out_proj, mlpwo
 *   save_dot_except_mlp            q, k, v, out_proj
 *   save_qkv_proj                  q, k, v
 *   save_out_proj                  out_proj
 *   qkv_proj_offloaded             q, k, v offloaded, the rest recomputed
 *   minimal_offloaded              minimal's tensors offloaded, context recomputed
 *   custom                         each name from its own key (default remat,
 *                                  decoder_layer_input device) */
#ifndef MT_MODELS_REMAT_H
#define MT_MODELS_REMAT_H

#include <stddef.h>
#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mt_remat_tensor {
    MT_RT_DECODER_LAYER_INPUT = 0,
    MT_RT_QUERY_PROJ,
    MT_RT_KEY_PROJ,
    MT_RT_VALUE_PROJ,
    MT_RT_CONTEXT,
    MT_RT_OUT_PROJ,
    MT_RT_MLPWI_0,
    MT_RT_MLPWI_1,
    MT_RT_MLPWO,
    MT_RT_COUNT
} mt_remat_tensor;

/* Every tensor a decoder layer saves for its backward, in the order the model plans
 * them: the one list of these names ("layers.<l>.<name>" plan entries, the remat
 * names above, the activation probes). The nine remat names are a subset, mapped by
 * mt_layer_tensor_remat. */
typedef enum mt_layer_tensor {
    MT_LT_DECODER_LAYER_INPUT = 0, /* decoder_layer_input [N, D] */
    MT_LT_INPUT_NORM_RSTD,         /* input_norm_rstd: input_layernorm rstd [N] */
    MT_LT_QUERY_NORM_RSTD,         /* query_norm_rstd: q_norm rstd [N*H] (qk-norm) */
    MT_LT_KEY_NORM_RSTD,           /* key_norm_rstd: k_norm rstd [N*Hkv] (qk-norm) */
    MT_LT_QUERY_PROJ,              /* query_proj [N, H*Dh] after qk-norm and RoPE */
    MT_LT_KEY_PROJ,                /* key_proj [N, Hkv*Dh] after qk-norm and RoPE */
    MT_LT_VALUE_PROJ,              /* value_proj [N, Hkv*Dh] */
    MT_LT_CONTEXT,                 /* context [N, H*Dh] */
    MT_LT_CONTEXT_LSE,             /* context_lse: context logsumexp [B, H, T] */
    MT_LT_OUT_PROJ,                /* out_proj [N, D] (o_proj output, before any post-attention norm) */
    MT_LT_POST_ATTN_NORM_RSTD,     /* post_attn_norm_rstd: post-attention norm rstd [N] (gemma2/3) */
    MT_LT_PRE_MLP_NORM_RSTD,       /* pre_mlp_norm_rstd: pre-MLP norm rstd [N] */
    MT_LT_MLPWI_0,                 /* mlpwi_0 [N, F] gate pre-activation */
    MT_LT_MLPWI_1,                 /* mlpwi_1 [N, F] up projection */
    MT_LT_MLPWO,                   /* mlpwo [N, D] down projection output (only with a post-FFW norm) */
    MT_LT_POST_FFW_NORM_RSTD,      /* post_ffw_norm_rstd: post-feedforward norm rstd [N] */
    MT_LT_COUNT
} mt_layer_tensor;

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

typedef enum mt_remat_policy_kind {
    MT_REMAT_FULL = 0,
    MT_REMAT_MINIMAL,
    MT_REMAT_MINIMAL_WITH_CONTEXT,
    MT_REMAT_SAVE_DOT_WITH_CONTEXT_EXCEPT_MLP,
    MT_REMAT_SAVE_DOT_EXCEPT_MLPWI,
    MT_REMAT_SAVE_DOT_EXCEPT_MLP,
    MT_REMAT_SAVE_QKV_PROJ,
    MT_REMAT_SAVE_OUT_PROJ,
    MT_REMAT_QKV_PROJ_OFFLOADED,
    MT_REMAT_MINIMAL_OFFLOADED,
    MT_REMAT_CUSTOM,
    MT_REMAT_POLICY_COUNT
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
