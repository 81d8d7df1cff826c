// llama-reference: reference data from llama.cpp's library (CPU, 2 threads) in the formats of
// ../shared/reference/README.md.
//
// Build (one line; LLAMA = the llama.cpp source tree, BIN = its build's bin/ with libllama.so):
//   LLAMA=/work/peer/llama_cpp_python-0.3.36/vendor/llama.cpp BIN=/work/peer/build/bin; g++ -std=c++17 -O2 -I$LLAMA/include -I$LLAMA/ggml/include -I$LLAMA/vendor scripts/llama-reference.cpp -o /tmp/llama-reference -L$BIN -lllama -lggml -lggml-base -Wl,-rpath,$BIN
//
// Usage:
//   llama-reference greedy   MODEL PROMPTS.jsonl OUT.jsonl
//       PROMPTS.jsonl: one JSON object a line, "prompt" and optionally "n_predict" (default 32).
//       Writes one line per prompt: prompt, prompt_ids, ids, text, n_generated, stop_type,
//       stopped_eos, top5_per_step, backend, settings, tokens_field. The prompt is tokenized
//       with special tokens parsed and BOS added when the model's add_bos says so; generation
//       is greedy (the first maximum of the raw logits), stops early at an end-of-generation
//       token (which is kept, as llama-server does); probabilities are the softmax of the raw
//       logits computed in double. Token texts are pieces without special-token text, with an
//       unfinished UTF-8 character at the end cut off (as llama-server's validate_utf8) and
//       any other invalid byte written as U+FFFD.
//   llama-reference tokenize MODEL OUT.jsonl SOURCE...
//       Writes {"text", "ids"} lines (special tokens parsed, no BOS) for each text of each
//       SOURCE, in order: --jsonl FILE (the "text" or "prompt" of each line), --vocab-inp FILE
//       (llama.cpp's test strings, separated by lines __ggml_vocab_test__), --file FILE (the
//       whole file as one text).
//
// Context: n_ctx 2048, 2 threads for generation and for batches, flash attention off (the
// f32 attention path; ../shared/reference was made so: its PPL 17.0046 is llama-perplexity's
// with -fa off), llama.cpp's other defaults.

#include "llama.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static const int N_THREADS = 2;
static const int N_CTX     = 2048;

[[noreturn]] static void die(const std::string & msg) {
    fprintf(stderr, "llama-reference: %s\n", msg.c_str());
    exit(1);
}

static std::string read_file(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        die("cannot read " + path);
    }
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// ---- JSON output in Python's json.dumps style (", " and ": ", non-ASCII written as is) ----

// Length of the valid prefix when the text may end inside a UTF-8 character (llama-server's
// validate_utf8).
static size_t validate_utf8(const std::string & text) {
    size_t len = text.size();
    for (size_t i = 1; i <= 4 && i <= len; ++i) {
        unsigned char c = text[len - i];
        if ((c & 0xE0) == 0xC0) {
            if (i < 2) return len - i;
        } else if ((c & 0xF0) == 0xE0) {
            if (i < 3) return len - i;
        } else if ((c & 0xF8) == 0xF0) {
            if (i < 4) return len - i;
        }
    }
    return len;
}

// Valid UTF-8, each byte of an invalid sequence replaced by U+FFFD.
static std::string sanitize_utf8(const std::string & s) {
    std::string out;
    size_t i = 0;
    while (i < s.size()) {
        unsigned char c = s[i];
        size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        bool ok = n > 0 && i + n <= s.size();
        for (size_t k = 1; ok && k < n; ++k) {
            ok = ((unsigned char) s[i + k] & 0xC0) == 0x80;
        }
        if (ok && n > 1) {
            uint32_t cp = c & (0x7F >> n);
            for (size_t k = 1; k < n; ++k) {
                cp = (cp << 6) | ((unsigned char) s[i + k] & 0x3F);
            }
            static const uint32_t min_cp[5] = { 0, 0, 0x80, 0x800, 0x10000 };
            ok = cp >= min_cp[n] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
        }
        if (ok) {
            out.append(s, i, n);
            i += n;
        } else {
            out += "\xEF\xBF\xBD";
            i += 1;
        }
    }
    return out;
}

static std::string json_str(const std::string & raw) {
    std::string s = sanitize_utf8(raw);
    std::string out = "\"";
    for (unsigned char c : s) {
        switch (c) {
            case '"':  out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n";  break;
            case '\r': out += "\\r";  break;
            case '\t': out += "\\t";  break;
            case '\b': out += "\\b";  break;
            case '\f': out += "\\f";  break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    snprintf(buf, sizeof(buf), "\\u%04x", c);
                    out += buf;
                } else {
                    out += (char) c;
                }
        }
    }
    return out + "\"";
}

// A double as Python's repr writes it: the shortest digits that round-trip, fixed notation
// for exponents -4..15, else d.ddde-XX.
static std::string json_num(double v) {
    if (!std::isfinite(v)) {
        return v != v ? "NaN" : v > 0 ? "Infinity" : "-Infinity";
    }
    if (v == 0) {
        return std::signbit(v) ? "-0.0" : "0.0";
    }
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
    std::string sci(buf, r.ptr);
    std::string sign;
    if (sci[0] == '-') {
        sign = "-";
        sci.erase(0, 1);
    }
    size_t e = sci.find('e');
    int exp10 = atoi(sci.c_str() + e + 1);
    std::string digits;
    for (size_t i = 0; i < e; ++i) {
        if (sci[i] != '.') digits += sci[i];
    }
    std::string out;
    if (exp10 < -4 || exp10 >= 16) {
        out = digits.substr(0, 1);
        if (digits.size() > 1) out += "." + digits.substr(1);
        char eb[16];
        snprintf(eb, sizeof(eb), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
        out += eb;
    } else if (exp10 < 0) {
        out = "0." + std::string(-exp10 - 1, '0') + digits;
    } else {
        int n_int = exp10 + 1;
        if ((int) digits.size() <= n_int) {
            out = digits + std::string(n_int - digits.size(), '0') + ".0";
        } else {
            out = digits.substr(0, n_int) + "." + digits.substr(n_int);
        }
    }
    return sign + out;
}

static std::string json_ids(const std::vector<llama_token> & ids) {
    std::string out = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i) out += ", ";
        out += std::to_string(ids[i]);
    }
    return out + "]";
}

// ---- llama.cpp ----

static std::vector<llama_token> tokenize(const llama_vocab * vocab, const std::string & text, bool add_special) {
    int n = -llama_tokenize(vocab, text.data(), (int32_t) text.size(), nullptr, 0, add_special, true);
    if (n < 0) {
        die("tokenize failed");
    }
    std::vector<llama_token> ids(n);
    if (llama_tokenize(vocab, text.data(), (int32_t) text.size(), ids.data(), n, add_special, true) != n) {
        die("tokenize failed");
    }
    return ids;
}

// The token's text without special-token text (llama-server's common_token_to_piece(.., false)).
static std::string piece(const llama_vocab * vocab, llama_token id) {
    std::vector<char> buf(256);
    int n = llama_token_to_piece(vocab, id, buf.data(), (int32_t) buf.size(), 0, false);
    if (n < 0) {
        buf.resize(-n);
        n = llama_token_to_piece(vocab, id, buf.data(), (int32_t) buf.size(), 0, false);
    }
    return std::string(buf.data(), n);
}

static std::string token_text(const llama_vocab * vocab, llama_token id) {
    std::string s = piece(vocab, id);
    s.resize(validate_utf8(s));
    return s;
}

static llama_model * load_model(const std::string & path) {
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(path.c_str(), mp);
    if (!model) {
        die("cannot load " + path);
    }
    return model;
}

static int run_greedy(const std::string & model_path, const std::string & prompts_path, const std::string & out_path) {
    llama_model * model = load_model(model_path);
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    const bool add_bos = llama_vocab_get_add_bos(vocab);

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = N_CTX;
    cp.n_batch = N_CTX;
    cp.n_threads = N_THREADS;
    cp.n_threads_batch = N_THREADS;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        die("cannot create a context");
    }

    FILE * out = fopen(out_path.c_str(), "w");
    if (!out) {
        die("cannot write " + out_path);
    }
    std::istringstream lines(read_file(prompts_path));
    std::string line;
    while (std::getline(lines, line)) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) {
            continue;
        }
        auto j = nlohmann::json::parse(line);
        const std::string prompt = j.at("prompt").get<std::string>();
        const int n_predict = j.value("n_predict", 32);

        std::vector<llama_token> prompt_ids = tokenize(vocab, prompt, true);
        if ((int) prompt_ids.size() + n_predict > N_CTX) {
            die("prompt too long for the context");
        }
        llama_memory_clear(llama_get_memory(ctx), true);
        if (llama_decode(ctx, llama_batch_get_one(prompt_ids.data(), (int32_t) prompt_ids.size())) != 0) {
            die("decode failed");
        }

        std::vector<llama_token> ids;
        std::string text;
        std::string steps;
        bool eos = false;
        std::vector<double> p(n_vocab);
        std::vector<int> order(n_vocab);
        while ((int) ids.size() < n_predict) {
            const float * logits = llama_get_logits_ith(ctx, -1);
            double mx = -INFINITY;
            for (int i = 0; i < n_vocab; ++i) mx = std::max(mx, (double) logits[i]);
            double sum = 0;
            for (int i = 0; i < n_vocab; ++i) {
                p[i] = std::exp((double) logits[i] - mx);
                sum += p[i];
            }
            for (int i = 0; i < n_vocab; ++i) p[i] /= sum;
            for (int i = 0; i < n_vocab; ++i) order[i] = i;
            // Highest logit first, the lower id first among equals: order[0] is llama.cpp's
            // greedy choice (the first maximum).
            std::partial_sort(order.begin(), order.begin() + 5, order.end(), [&](int a, int b) {
                return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
            });
            llama_token tok = order[0];

            std::string step = "{\"id\": " + std::to_string(tok) + ", \"token\": " + json_str(token_text(vocab, tok)) +
                               ", \"prob\": " + json_num(p[tok]) + ", \"top5\": [";
            for (int k = 0; k < 5; ++k) {
                int id = order[k];
                if (k) step += ", ";
                step += "{\"id\": " + std::to_string(id) + ", \"token\": " + json_str(token_text(vocab, id)) +
                        ", \"prob\": " + json_num(p[id]) + "}";
            }
            step += "]}";
            if (!steps.empty()) steps += ", ";
            steps += step;

            ids.push_back(tok);
            text += piece(vocab, tok);
            if (llama_vocab_is_eog(vocab, tok)) {
                eos = true;
                break;
            }
            if ((int) ids.size() == n_predict) {
                break;
            }
            if (llama_decode(ctx, llama_batch_get_one(&tok, 1)) != 0) {
                die("decode failed");
            }
        }
        text.resize(validate_utf8(text));

        std::string settings = "cpu libllama (llama_decode) n_ctx=" + std::to_string(N_CTX) +
                               " n_threads=" + std::to_string(N_THREADS) + " flash_attn=off" +
                               " greedy (first maximum of the raw logits) n_predict=" + std::to_string(n_predict) +
                               "; probs = softmax of raw logits in double; " +
                               (add_bos ? "BOS added (model add_bos_token=true)" : "BOS not added (model add_bos_token=false)") +
                               "; special tokens parsed; generation stops early at EOG token";
        fprintf(out, "{\"prompt\": %s, \"prompt_ids\": %s, \"ids\": %s, \"text\": %s, \"n_generated\": %zu, "
                     "\"stop_type\": \"%s\", \"stopped_eos\": %s, \"top5_per_step\": [%s], \"backend\": \"cpu\", "
                     "\"settings\": %s, \"tokens_field\": %s}\n",
                json_str(prompt).c_str(), json_ids(prompt_ids).c_str(), json_ids(ids).c_str(), json_str(text).c_str(),
                ids.size(), eos ? "eos" : "limit", eos ? "true" : "null", steps.c_str(), json_str(settings).c_str(),
                json_ids(ids).c_str());
        fflush(out);
        fprintf(stderr, "llama-reference: %zu prompt tokens, %zu generated (%s)\n", prompt_ids.size(), ids.size(),
                eos ? "eos" : "limit");
    }
    fclose(out);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}

static int run_tokenize(const std::string & model_path, const std::string & out_path, const std::vector<std::string> & sources) {
    std::vector<std::string> texts;
    for (size_t i = 0; i + 1 < sources.size(); i += 2) {
        const std::string & kind = sources[i];
        const std::string data = read_file(sources[i + 1]);
        if (kind == "--jsonl") {
            std::istringstream lines(data);
            std::string line;
            while (std::getline(lines, line)) {
                if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
                auto j = nlohmann::json::parse(line);
                texts.push_back(j.contains("text") ? j["text"].get<std::string>() : j.at("prompt").get<std::string>());
            }
        } else if (kind == "--vocab-inp") {
            const std::string sep = "\n__ggml_vocab_test__\n";
            size_t pos = 0;
            for (size_t next; (next = data.find(sep, pos)) != std::string::npos; pos = next + sep.size()) {
                texts.push_back(data.substr(pos, next - pos));
            }
            if (pos < data.size()) {
                texts.push_back(data.substr(pos)); // a last string without a separator after it
            }
        } else if (kind == "--file") {
            texts.push_back(data);
        } else {
            die("unknown source " + kind);
        }
    }
    if (sources.size() % 2 != 0) {
        die("a source without its file");
    }

    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mp);
    if (!model) {
        die("cannot load " + model_path);
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    FILE * out = fopen(out_path.c_str(), "w");
    if (!out) {
        die("cannot write " + out_path);
    }
    for (const auto & t : texts) {
        fprintf(out, "{\"text\": %s, \"ids\": %s}\n", json_str(t).c_str(), json_ids(tokenize(vocab, t, false)).c_str());
    }
    fclose(out);
    fprintf(stderr, "llama-reference: %zu texts\n", texts.size());
    llama_model_free(model);
    return 0;
}

int main(int argc, char ** argv) {
    llama_log_set([](ggml_log_level level, const char * text, void *) {
        if (level >= GGML_LOG_LEVEL_WARN) fputs(text, stderr);
    }, nullptr);
    llama_backend_init();
    std::vector<std::string> args(argv + 1, argv + argc);
    int rc;
    if (args.size() == 4 && args[0] == "greedy") {
        rc = run_greedy(args[1], args[2], args[3]);
    } else if (args.size() >= 5 && args[0] == "tokenize") {
        rc = run_tokenize(args[1], args[2], std::vector<std::string>(args.begin() + 3, args.end()));
    } else {
        fprintf(stderr,
                "usage: %s greedy MODEL PROMPTS.jsonl OUT.jsonl\n"
                "       %s tokenize MODEL OUT.jsonl [--jsonl F | --vocab-inp F | --file F]...\n",
                argv[0], argv[0]);
        return 2;
    }
    llama_backend_free();
    return rc;
}
