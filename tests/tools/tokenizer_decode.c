/* tests/tools/tokenizer_decode.c: decode id lists with train/tokenizer.h, for
 * tests/test_tokenizer_decode.sh (compared with the `tokenizers` library's decode).
 *
 *   tokenizer_decode TOKENIZER < IDS
 *
 * Each input line holds space-separated ids; each output line is the decoded text's
 * bytes in lower-case hex (so any byte, newline included, compares exactly), or
 * "ERROR <message>" and exit 2 when the tokenizer does not load. Line 0 of the output
 * is "bos <id> size <n>". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/sample.h"
#include "train/tokenizer.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: tokenizer_decode TOKENIZER < IDS\n");
        return 2;
    }
    mt_tokenizer *t;
    if (mt_tokenizer_load(&t, argv[1]) != MT_OK) {
        printf("ERROR %s\n", mt_last_error());
        return 2;
    }
    printf("bos %lld size %lld\n", (long long)mt_tokenizer_bos(t), (long long)mt_tokenizer_size(t));
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, stdin) >= 0) {
        int32_t *ids = NULL;
        int64_t n = 0;
        if (strspn(line, " \n") != strlen(line) && mt_sample_parse_ids("ids", line, &ids, &n) != MT_OK) {
            printf("ERROR %s\n", mt_last_error());
            continue;
        }
        char *text;
        if (mt_tokenizer_decode(t, ids, n, &text) != MT_OK) {
            printf("ERROR %s\n", mt_last_error());
        } else {
            for (const unsigned char *p = (const unsigned char *)text; *p; p++) printf("%02x", *p);
            printf("\n");
            free(text);
        }
        free(ids);
    }
    free(line);
    mt_tokenizer_free(t);
    return 0;
}
