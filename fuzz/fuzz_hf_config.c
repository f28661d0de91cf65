/* fuzz/fuzz_hf_config.c: libFuzzer target for the Hugging Face config.json reader
 * (models/checkpoint.h mt_hf_config_read). The input is written to a file and read;
 * when it parses, the config is validated and, if valid, written back with
 * mt_hf_config_write and read again: the second read must succeed and give the same
 * config (the writer must produce what the reader accepts). Any crash, sanitizer
 * report or leak is a bug. Build and run: fuzz/build.sh, tests/test_fuzz.sh. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "models/checkpoint.h"
#include "models/config.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/hf_config_same.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64], back[80];
    if (mt_fuzz_write_temp(path, sizeof path, "cfg", data, size) != 0) return 0;
    mt_model_config c;
    if (mt_hf_config_read(path, &c) == MT_OK && mt_model_config_validate(&c) == MT_OK &&
        c.num_decoder_layers <= 4096) {
        snprintf(back, sizeof back, "%s.out", path);
        if (mt_hf_config_write(back, &c) != MT_OK) abort();
        mt_model_config c2;
        if (mt_hf_config_read(back, &c2) != MT_OK) abort();
        if (!mt_config_same(&c, &c2)) abort();
        unlink(back);
    }
    unlink(path);
    return 0;
}
