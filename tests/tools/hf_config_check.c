/* tests/tools/hf_config_check.c: read Hugging Face config.json files the way a load
 * does and check that what meshtrain writes back reads as the same model.
 *
 *   hf_config_check [--keep DIR] FILE...
 *
 * For each FILE: mt_hf_config_read; if that fails the file is reported as "refused"
 * (with the message) and is not an error of this tool. Otherwise the config must pass
 * mt_model_config_validate, mt_hf_config_write must write it, mt_hf_config_read must
 * read the written file, and every model field must be equal (including which layers
 * are local). Prints one line per file; exit 0 when every accepted file round-trips,
 * 1 otherwise. Used by tests/test_hf_config.sh on tests/fuzz_corpus/hf_config. With
 * --keep DIR the file written for each accepted FILE stays as DIR/<FILE's base name>
 * (tests/test_hf_gemma4_config.sh has transformers read them). */
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "models/checkpoint.h"
#include "models/config.h"
#include "fuzz/hf_config_same.h"

int main(int argc, char **argv) {
    const char *keep = NULL;
    int first = 1;
    if (argc > 2 && strcmp(argv[1], "--keep") == 0) keep = argv[2], first = 3;
    if (argc <= first) {
        fprintf(stderr, "usage: hf_config_check [--keep DIR] FILE...\n");
        return 1;
    }
    char out[1024];
    snprintf(out, sizeof out, "/tmp/mt_hf_config_check_%ld.json", (long)getpid());
    int bad = 0;
    for (int i = first; i < argc; i++) {
        if (keep) {
            char base[1024];
            snprintf(base, sizeof base, "%s", argv[i]);
            snprintf(out, sizeof out, "%s/%s", keep, basename(base));
        }
        mt_model_config a, b;
        if (mt_hf_config_read(argv[i], &a) != MT_OK) {
            printf("refused  %s: %s\n", argv[i], mt_last_error());
            continue;
        }
        const char *why = NULL;
        if (mt_model_config_validate(&a) != MT_OK) why = "invalid";
        else if (mt_hf_config_write(out, &a) != MT_OK) why = "write failed";
        else if (mt_hf_config_read(out, &b) != MT_OK) why = "written file refused";
        else if (!mt_config_same(&a, &b)) why = "written file reads as a different model";
        if (why) {
            printf("FAIL     %s: %s: %s\n", argv[i], why, mt_last_error());
            bad++;
        } else {
            printf("ok       %s: %s, %lld layers, round trip equal\n", argv[i], mt_decoder_block_name(a.decoder_block),
                   (long long)a.num_decoder_layers);
        }
    }
    if (!keep) unlink(out);
    return bad ? 1 : 0;
}
