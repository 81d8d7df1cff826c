/* Generates text with memwall's C API: load, tokenize, generate with a token callback.
 *
 *   cc -I include examples/c/generate.c -L target/release -lmemwall_c -o generate
 *   ./generate MODEL.gguf "The three primary colors are"
 */
#include <stdio.h>
#include <stdlib.h>

#include "memwall.h"

static int32_t on_token(const char *text, size_t len, int32_t token, void *user_data) {
    (void)token;
    size_t *n_pieces = user_data;
    *n_pieces += 1;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 1; /* continue */
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : getenv("MEMWALL_MODEL");
    const char *prompt = argc > 2 ? argv[2] : "The three primary colors are";
    if (path == NULL) {
        fprintf(stderr, "usage: %s MODEL.gguf [PROMPT]\n", argv[0]);
        return 2;
    }
    memwall_config config = memwall_config_default();
    config.n_ctx = 512;
    config.device = "cpu";
    memwall_model *model = memwall_model_load(path, &config);
    if (model == NULL) {
        fprintf(stderr, "load failed: %s\n", memwall_last_error());
        return 1;
    }
    int32_t n_tokens = memwall_tokenize(model, prompt, 1, NULL, 0);
    uint32_t ids[256];
    if (n_tokens < 0 || memwall_tokenize(model, prompt, 1, ids, 256) != n_tokens) {
        fprintf(stderr, "tokenize failed: %s\n", memwall_last_error());
        return 1;
    }
    fprintf(stderr, "memwall %s, prompt of %d tokens, first id %u\n", memwall_version(),
            n_tokens, ids[0]);

    memwall_session *session = memwall_session_new(model, NULL);
    if (session == NULL) {
        fprintf(stderr, "session failed: %s\n", memwall_last_error());
        return 1;
    }
    size_t n_pieces = 0;
    printf("%s", prompt);
    int32_t stop = memwall_generate(session, prompt, 32, on_token, &n_pieces);
    printf("\n");
    if (stop < 0) {
        fprintf(stderr, "generate failed (%d): %s\n", stop, memwall_last_error());
        return 1;
    }
    fprintf(stderr, "stop %d after %zu pieces\n", stop, n_pieces);
    memwall_session_free(session);
    memwall_model_free(model);
    return 0;
}
