/* models/remat.c: remat policy names and their tables (see remat.h; MaxText
 * layers/decoders.py get_remat_policy). */
#include "models/remat.h"

#include <stdio.h>
#include <string.h>

#define NAME_(id, name, ...) name,
#define LT_OF_RT_(id, ...) MT_LT_##id,
#define SKIP_(...)
static const char *const k_layer_tensor_names[MT_LT_COUNT] = {MT_LAYER_TENSORS(NAME_, NAME_)};
/* The layer tensor each remat name is (MT_RT_* order). */
static const mt_layer_tensor k_remat_layer_tensor[MT_RT_COUNT] = {MT_LAYER_TENSORS(SKIP_, LT_OF_RT_)};
static const char *const k_action_names[3] = {"remat", "offload", "device"};
static const char *const k_policy_names[MT_REMAT_POLICY_COUNT] = {MT_REMAT_POLICIES(NAME_)};

const char *mt_layer_tensor_name(mt_layer_tensor t) {
    return (int)t >= 0 && t < MT_LT_COUNT ? k_layer_tensor_names[t] : NULL;
}

int mt_layer_tensor_remat(mt_layer_tensor t) {
    if (t == MT_LT_CONTEXT_LSE) return MT_RT_CONTEXT;
    for (int i = 0; i < MT_RT_COUNT; i++)
        if (k_remat_layer_tensor[i] == t) return i;
    return -1;
}

const char *mt_remat_tensor_name(mt_remat_tensor t) {
    return (int)t >= 0 && t < MT_RT_COUNT ? k_layer_tensor_names[k_remat_layer_tensor[t]] : NULL;
}
const char *mt_remat_action_name(mt_remat_action a) {
    return (int)a >= 0 && (int)a < 3 ? k_action_names[a] : NULL;
}
const char *mt_remat_policy_name(mt_remat_policy_kind k) {
    return (int)k >= 0 && k < MT_REMAT_POLICY_COUNT ? k_policy_names[k] : NULL;
}

static void join(char *buf, size_t n, const char *const *names, int count) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < count; i++) {
        int w = snprintf(buf + used, n - used, "%s%s", i ? ", " : "", names[i]);
        if (w < 0 || (size_t)w >= n - used) break;
        used += (size_t)w;
    }
}

mt_status mt_remat_tensor_parse(const char *s, mt_remat_tensor *out) {
    for (int i = 0; s && i < MT_RT_COUNT; i++)
        if (strcmp(s, mt_remat_tensor_name((mt_remat_tensor)i)) == 0) return *out = (mt_remat_tensor)i, MT_OK;
    char all[512];
    const char *names[MT_RT_COUNT];
    for (int i = 0; i < MT_RT_COUNT; i++) names[i] = mt_remat_tensor_name((mt_remat_tensor)i);
    join(all, sizeof all, names, MT_RT_COUNT);
    return mt_set_error(MT_ERR_INVALID, "unknown remat tensor name '%s' (known: %s)", s ? s : "(null)", all);
}

mt_status mt_remat_action_parse(const char *s, mt_remat_action *out) {
    for (int i = 0; s && i < 3; i++)
        if (strcmp(s, k_action_names[i]) == 0) return *out = (mt_remat_action)i, MT_OK;
    return mt_set_error(MT_ERR_INVALID, "unknown remat action '%s' (device, remat or offload)", s ? s : "(null)");
}

mt_status mt_remat_policy_parse(const char *s, mt_remat_policy_kind *out) {
    for (int i = 0; s && i < MT_REMAT_POLICY_COUNT; i++)
        if (strcmp(s, k_policy_names[i]) == 0) return *out = (mt_remat_policy_kind)i, MT_OK;
    char all[1024];
    join(all, sizeof all, k_policy_names, MT_REMAT_POLICY_COUNT);
    return mt_set_error(MT_ERR_INVALID, "unknown remat_policy '%s' (known: %s)", s ? s : "(null)", all);
}

mt_remat_policy mt_remat_policy_keep_all(void) {
    mt_remat_policy p;
    for (int i = 0; i < MT_RT_COUNT; i++) p.action[i] = MT_RA_DEVICE;
    return p;
}

mt_status mt_remat_policy_resolve(mt_remat_policy_kind k, const mt_remat_action *custom,
                                  mt_remat_policy *out) {
    if ((int)k < 0 || k >= MT_REMAT_POLICY_COUNT)
        return mt_set_error(MT_ERR_INVALID, "remat policy %d out of range", (int)k);
#define LETTERS_(id, name, letters) letters,
    static const char *const table[MT_REMAT_POLICY_COUNT] = {MT_REMAT_POLICIES(LETTERS_)};
    if (k == MT_REMAT_CUSTOM) {
        for (int i = 0; i < MT_RT_COUNT; i++)
            out->action[i] = custom ? custom[i] : (i == MT_RT_DECODER_LAYER_INPUT ? MT_RA_DEVICE : MT_RA_REMAT);
    } else {
        for (int i = 0; i < MT_RT_COUNT; i++) {
            char c = table[k][i];
            out->action[i] = c == 'D' ? MT_RA_DEVICE : c == 'O' ? MT_RA_OFFLOAD : MT_RA_REMAT;
        }
    }
    if (out->action[MT_RT_DECODER_LAYER_INPUT] != MT_RA_DEVICE)
        return mt_set_error(MT_ERR_INVALID,
                            "decoder_layer_input=%s is not supported: meshtrain keeps every layer's input on "
                            "the device (the backward recomputes from it); use decoder_layer_input=device",
                            mt_remat_action_name(out->action[MT_RT_DECODER_LAYER_INPUT]));
    return MT_OK;
}

const char *mt_remat_policy_str(const mt_remat_policy *p, char *buf, size_t n) {
    size_t used = 0;
    if (!buf || n == 0) return buf;
    buf[0] = '\0';
    for (int i = 1; i < MT_RT_COUNT; i++) {
        int w = snprintf(buf + used, n - used, "%s%s=%s", i > 1 ? "," : "", mt_remat_tensor_name((mt_remat_tensor)i),
                         k_action_names[p->action[i]]);
        if (w < 0 || (size_t)w >= n - used) break;
        used += (size_t)w;
    }
    return buf;
}
