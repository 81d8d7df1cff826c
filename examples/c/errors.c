/* Errors through memwall's C API come back as codes and messages, never as a crash:
 * a missing file, a file that is not GGUF, a truncated model, NULL arguments, a buffer that
 * is too small, and a cancel. Prints one "case: code message" line per check and exits
 * non-zero if any check fails.
 *
 *   ./errors MODEL.gguf SCRATCH_DIR
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memwall.h"

static int failures = 0;

static void expect(const char *what, int ok, int32_t code) {
    const char *msg = memwall_last_error();
    printf("%s: %s code=%d message=%s\n", what, ok ? "ok" : "FAILED", code, msg);
    if (!ok) failures++;
}

/* Writes the first `n` bytes of `src` (all of it when n == 0) to `dst`. */
static long copy_prefix(const char *src, const char *dst, long n) {
    FILE *in = fopen(src, "rb");
    FILE *out = fopen(dst, "wb");
    if (!in || !out) return -1;
    char buf[65536];
    long done = 0;
    size_t got;
    while ((n == 0 || done < n) && (got = fread(buf, 1, sizeof buf, in)) > 0) {
        if (n > 0 && done + (long)got > n) got = (size_t)(n - done);
        fwrite(buf, 1, got, out);
        done += (long)got;
    }
    fclose(in);
    fclose(out);
    return done;
}

static int32_t stop_at_once(const char *text, size_t len, int32_t token, void *user_data) {
    (void)text; (void)len; (void)token; (void)user_data;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf SCRATCH_DIR\n", argv[0]);
        return 2;
    }
    const char *model_path = argv[1];
    char path[4096];
    memwall_config config = memwall_config_default();
    config.device = "cpu";
    config.n_ctx = 256;

    memwall_model *m = memwall_model_load("/nonexistent/memwall/model.gguf", &config);
    expect("missing file", m == NULL && strstr(memwall_last_error(), "cannot open") != NULL, 0);

    snprintf(path, sizeof path, "%s/not-gguf.gguf", argv[2]);
    FILE *f = fopen(path, "wb");
    fputs("this is not a model file, only some text to parse", f);
    fclose(f);
    m = memwall_model_load(path, &config);
    expect("not a GGUF file", m == NULL && strstr(memwall_last_error(), "GGUF") != NULL, 0);

    /* The test model cut in the middle of its tensor data. */
    snprintf(path, sizeof path, "%s/truncated.gguf", argv[2]);
    FILE *probe = fopen(model_path, "rb");
    fseek(probe, 0, SEEK_END);
    long size = ftell(probe);
    fclose(probe);
    copy_prefix(model_path, path, size / 2);
    m = memwall_model_load(path, &config);
    expect("truncated model", m == NULL && strlen(memwall_last_error()) > 0, 0);

    m = memwall_model_load(NULL, &config);
    expect("NULL path", m == NULL && strstr(memwall_last_error(), "NULL") != NULL, 0);

    config.device = "no-such-adapter-kind-xyz";
    m = memwall_model_load(model_path, &config);
    expect("unknown device", m == NULL && strlen(memwall_last_error()) > 0, 0);
    config.device = "cpu";

    config.cache_type_k = "q3_x";
    m = memwall_model_load(model_path, &config);
    expect("unknown KV cache type",
           m == NULL && strstr(memwall_last_error(), "q3_x") != NULL, 0);
    config.cache_type_k = "q8_0";
    config.cache_type_v = "q4_0";
    config.ctx_overflow_stop = 1; /* sessions without a config stop at a full context */

    m = memwall_model_load(model_path, &config);
    expect("good model loads", m != NULL && memwall_last_error()[0] == '\0', 0);
    if (m == NULL) return 1;

    uint32_t ids[2];
    int32_t r = memwall_tokenize(m, "a prompt of several words", 1, ids, 2);
    expect("small buffer", r == MEMWALL_ERR_BUFFER_TOO_SMALL, r);
    r = memwall_tokenize(m, NULL, 1, ids, 2);
    expect("NULL text", r == MEMWALL_ERR_INVALID_ARGUMENT, r);
    r = memwall_tokenize(NULL, "x", 1, ids, 2);
    expect("NULL model", r == MEMWALL_ERR_INVALID_ARGUMENT, r);

    memwall_session *s = memwall_session_new(m, NULL);
    expect("session", s != NULL, 0);
    r = memwall_generate(s, "", 8, NULL, NULL);
    expect("empty prompt", r == MEMWALL_ERR_INVALID_ARGUMENT, r);
    r = memwall_generate(s, "Hello", -1, NULL, NULL);
    expect("negative max_tokens", r == MEMWALL_ERR_INVALID_ARGUMENT, r);
    r = memwall_generate(NULL, "Hello", 8, NULL, NULL);
    expect("NULL session", r == MEMWALL_ERR_INVALID_ARGUMENT, r);

    /* A prompt longer than the context of 256 tokens. */
    char *long_prompt = malloc(8192);
    long_prompt[0] = '\0';
    for (int i = 0; i < 400; i++) strcat(long_prompt, "word ");
    r = memwall_generate(s, long_prompt, 8, NULL, NULL);
    expect("prompt over the context", r == MEMWALL_ERR_CONTEXT_FULL, r);
    /* The default: the context shifts and the same prompt generates. */
    memwall_config shifting = memwall_config_default();
    memwall_session *s2 = memwall_session_new(m, &shifting);
    r = memwall_generate(s2, long_prompt, 4, NULL, NULL);
    expect("prompt over the context shifts", r == MEMWALL_STOP_LIMIT, r);
    memwall_session_free(s2);
    free(long_prompt);

    r = memwall_generate(s, "Hello", 8, stop_at_once, NULL);
    expect("callback stops", r == MEMWALL_STOP_CANCELLED, r);
    r = memwall_generate(s, " again", 4, NULL, NULL);
    expect("generates after errors", r == MEMWALL_STOP_LIMIT || r == MEMWALL_STOP_EOG, r);
    expect("cancel returns ok", memwall_cancel(s) == MEMWALL_OK, 0);

    memwall_session_free(s);
    memwall_model_free(m);
    memwall_model_free(NULL);
    memwall_session_free(NULL);
    printf("%d failure(s)\n", failures);
    return failures == 0 ? 0 : 1;
}
