/*
 * memwall.h: the C API of memwall (LLM inference on phone and desktop GPUs through wgpu,
 * with a CPU path), for apps: Android through JNI, iOS through Swift.
 *
 * Link against libmemwall_c (capi/, `cargo build -p memwall-c --release`): the shared
 * library (libmemwall_c.so / .dylib) or the static one (libmemwall_c.a).
 *
 * Errors: functions return NULL or a negative memwall_status, and memwall_last_error()
 * says what went wrong. No Rust panic crosses this boundary: an internal error comes back as
 * MEMWALL_ERR_INTERNAL.
 *
 * Threads: a model may be shared by threads; a session is used by one call at a time
 * (a second concurrent call fails with MEMWALL_ERR_BUSY), except memwall_cancel, which any
 * thread may call while memwall_generate runs.
 *
 * tests/header.rs (in capi/) checks that every prototype here matches the library's
 * exports, by name and parameter count; examples/c/ compiles against this file in CI.
 */
#ifndef MEMWALL_H
#define MEMWALL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Negative return codes. */
typedef enum memwall_status {
    MEMWALL_OK = 0,
    MEMWALL_ERR_INVALID_ARGUMENT = -1, /* NULL pointer, bad UTF-8, out-of-range value */
    MEMWALL_ERR_IO = -2,               /* the file cannot be opened or mapped */
    MEMWALL_ERR_FORMAT = -3,           /* not a valid model: GGUF, configuration, tokenizer */
    MEMWALL_ERR_UNSUPPORTED = -4,      /* a tensor type memwall cannot run */
    MEMWALL_ERR_CONTEXT_FULL = -5,     /* the prompt does not fit the context */
    MEMWALL_ERR_OUT_OF_MEMORY = -6,    /* an allocation failed, or mem_budget is below the model's minimum */
    MEMWALL_ERR_GPU = -7,              /* GPU bring-up or execution failed */
    MEMWALL_ERR_BUFFER_TOO_SMALL = -8, /* memwall_tokenize: more tokens than the buffer holds */
    MEMWALL_ERR_BUSY = -9,             /* the session is in a call on another thread */
    MEMWALL_ERR_INTERNAL = -10         /* a bug in memwall (a caught panic) */
} memwall_status;

/* How memwall_generate stopped (its return value when >= 0). */
typedef enum memwall_stop {
    MEMWALL_STOP_EOG = 0,          /* the model ended its turn */
    MEMWALL_STOP_LIMIT = 1,        /* max_tokens were generated */
    MEMWALL_STOP_CONTEXT_FULL = 2, /* the context is full */
    MEMWALL_STOP_CANCELLED = 3     /* memwall_cancel, or the callback returned 0 */
} memwall_stop;

/* Load and sampling settings; start from memwall_config_default(). */
typedef struct memwall_config {
    const char *device;      /* "auto", "cpu", "gpu", adapter index or name; NULL = "auto" */
    uint64_t gpu_mem_budget; /* bytes of GPU memory the model may use; 0 = no budget */
    uint32_t n_ctx;          /* context in tokens; 0 = the model's, capped at 4096 */
    uint32_t n_threads;      /* CPU worker threads; 0 = every core */
    float temperature;       /* <= 0: greedy */
    uint32_t top_k;          /* 0 = off */
    float top_p;             /* 1 = off */
    float min_p;             /* 0 = off */
    float repeat_penalty;    /* 1 = off */
    uint64_t seed;
    const char *cache_type_k; /* KV cache type of keys: "f16", "q8_0", "q4_0", "f32";
                               * NULL = default (f16) */
    const char *cache_type_v; /* KV cache type of values, as cache_type_k */
    int32_t ctx_overflow_stop; /* nonzero: a full context ends the generation
                                * (MEMWALL_STOP_CONTEXT_FULL) and a prompt over it is refused
                                * (MEMWALL_ERR_CONTEXT_FULL); 0 = shift: drop the oldest half
                                * of the tokens and go on */
    const char *cache_dir;   /* GPU start-up caches (selftest record, pipeline cache);
                              * NULL = $MEMWALL_CACHE_DIR, else $XDG_CACHE_HOME/memwall,
                              * else ~/.cache/memwall */
    uint64_t mem_budget;     /* bytes of memory the model may hold on the CPU (anonymous,
                              * mapped weights, KV cache, stream slots); blocks that do not
                              * fit stream from storage; 0 = the process's memory limit
                              * (cgroup, else available memory) less a margin */
} memwall_config;

/* One message of a conversation. */
typedef struct memwall_message {
    const char *role;    /* "system", "user", "assistant", ... */
    const char *content;
} memwall_message;

typedef struct memwall_model memwall_model;
typedef struct memwall_session memwall_session;

/* Receives each piece of generated text: `len` bytes of UTF-8 at `text` (also
 * NUL-terminated; valid only during the call) and the token id (-1 for text at the end that
 * no token completed). Returns nonzero to continue, 0 to stop. Must not unwind/throw. */
typedef int32_t (*memwall_token_callback)(const char *text, size_t len, int32_t token,
                                          void *user_data);

/* The library version, e.g. "0.1.0" (static storage). */
const char *memwall_version(void);

/* The message of this thread's last failed call, "" if it succeeded. Never NULL; valid
 * until this thread's next memwall call. */
const char *memwall_last_error(void);

/* Defaults: device auto, no GPU budget, the model's context, every core, greedy sampling. */
memwall_config memwall_config_default(void);

/* Loads a GGUF model file. Returns NULL on error. `config` NULL = defaults. */
memwall_model *memwall_model_load(const char *path, const memwall_config *config);

/* memwall_model_load, the model sharing the memory budget with `other` (NULL = none), a model
 * loaded first, typically the draft model of speculative decoding: this model's plan counts
 * what `other` planned to hold and gets the rest of the budget. Load the draft first. */
memwall_model *memwall_model_load_sharing(const char *path, const memwall_config *config,
                                          const memwall_model *other);

/* Frees a model (NULL is ignored). Free its sessions first. */
void memwall_model_free(memwall_model *model);

/* Tokenizes `text` into `out` (room for `cap` ids). Returns the number of tokens or a
 * negative memwall_status (MEMWALL_ERR_BUFFER_TOO_SMALL if there are more than `cap`).
 * With out == NULL and cap == 0 it only counts. `add_special` != 0 adds the BOS token a
 * context starts with. */
int32_t memwall_tokenize(const memwall_model *model, const char *text, int32_t add_special,
                         uint32_t *out, int32_t cap);

/* Starts a conversation on `model` (which must outlive it). `config` NULL = the sampling
 * the model was loaded with; otherwise its sampling fields are used (the rest is ignored).
 * Returns NULL on error. */
memwall_session *memwall_session_new(const memwall_model *model, const memwall_config *config);

/* Frees a session (NULL is ignored); no call on it may be running. */
void memwall_session_free(memwall_session *session);

/* Forgets the session's context. Returns MEMWALL_OK or a negative memwall_status. */
int32_t memwall_session_reset(memwall_session *session);

/* Speculative decoding with `draft`, a model of the same vocabulary (another vocabulary is
 * MEMWALL_ERR_INVALID_ARGUMENT): it drafts up to `draft_max` tokens per pass (stopping when
 * its top token's probability is below `p_min`; fewer than `draft_min` decode plainly), and
 * each pass of the session's model verifies them at once. Greedy output is plain decoding's;
 * sampled output has its distribution. The session keeps what it needs of `draft`, which may
 * be freed afterwards. Returns MEMWALL_OK or a negative memwall_status. */
int32_t memwall_session_set_draft_model(memwall_session *session, const memwall_model *draft,
                                        uint32_t draft_max, uint32_t draft_min, float p_min);

/* Speculative decoding by prompt lookup: the latest earlier occurrence of the context's last
 * n tokens (n from `ngram_max` down to `ngram_min`) proposes up to `draft_max` tokens (code,
 * edits, quoting). Returns MEMWALL_OK or a negative memwall_status. */
int32_t memwall_session_set_draft_lookup(memwall_session *session, uint32_t ngram_min,
                                         uint32_t ngram_max, uint32_t draft_max);

/* Plain decoding again. With `passes`, `drafted`, `accepted` non-NULL, first writes what
 * speculation did since it was set: verification passes, drafted and accepted tokens.
 * Returns MEMWALL_OK or a negative memwall_status. */
int32_t memwall_session_clear_draft(memwall_session *session, uint64_t *passes,
                                    uint64_t *drafted, uint64_t *accepted);

/* Generates up to `max_tokens` tokens after `prompt`, which is appended to the session's
 * context (the first prompt starts with BOS). `callback` (may be NULL) gets the text as it
 * is produced. Returns a memwall_stop (>= 0) or a negative memwall_status. */
int32_t memwall_generate(memwall_session *session, const char *prompt, int32_t max_tokens,
                         memwall_token_callback callback, void *user_data);

/* Generates the assistant's reply to the conversation `messages[0..n_messages]`, rendered
 * with the model's chat template. When the session already holds the earlier turns, only
 * the new part is evaluated; otherwise its context starts over. Returns a memwall_stop
 * (>= 0) or a negative memwall_status. */
int32_t memwall_generate_chat(memwall_session *session, const memwall_message *messages,
                              size_t n_messages, int32_t max_tokens,
                              memwall_token_callback callback, void *user_data);

/* How many times the session's stages moved from the GPU to the CPU because the GPU failed
 * (device lost or out of memory, at load or start included); the generation went on from
 * the same state with the same tokens. With `buf` non-NULL, the last move's description is
 * written there, NUL-terminated and cut to `cap` bytes. Returns the count or a negative
 * memwall_status. */
int32_t memwall_session_fallbacks(memwall_session *session, char *buf, size_t cap);

/* Stops the generation running on `session`, from any thread, before its next token or
 * prompt batch (it then returns MEMWALL_STOP_CANCELLED). memwall_generate clears the request
 * when it starts. Returns MEMWALL_OK or a negative memwall_status. */
int32_t memwall_cancel(const memwall_session *session);

#ifdef __cplusplus
}
#endif

#endif /* MEMWALL_H */
