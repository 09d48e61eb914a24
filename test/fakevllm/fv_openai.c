#include "fv_openai.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"

/* Characters per token for the prompt estimate; vLLM's tokenizers give
 * roughly this for English text, and callers that care pass
 * "thaw_prompt_tokens" instead. */
#define CHARS_PER_TOKEN 4
/* Chat templates add a few tokens per message (role markers). */
#define CHAT_TOKENS_PER_MESSAGE 4

static long chars_to_tokens(size_t chars)
{
    long t = (long)((chars + CHARS_PER_TOKEN - 1) / CHARS_PER_TOKEN);
    return t > 0 ? t : 1;
}

/* Prompt of /v1/completions: a string, a list of strings, a list of token
 * ids or a list of such lists. Lists of strings are counted as one prompt
 * (vLLM would answer with one choice per prompt; one choice is enough here). */
static int completion_prompt_tokens(json_t *prompt, long *out, char *err, size_t errlen)
{
    if (json_is_string(prompt)) {
        *out = chars_to_tokens(json_string_length(prompt));
        return 0;
    }
    if (!json_is_array(prompt) || json_array_size(prompt) == 0) {
        snprintf(err, errlen, "\"prompt\" must be a string or a non-empty array");
        return -1;
    }
    long total = 0;
    size_t i;
    json_t *item;
    json_array_foreach(prompt, i, item) {
        if (json_is_string(item)) {
            total += chars_to_tokens(json_string_length(item));
        } else if (json_is_integer(item)) {
            total += 1;
        } else if (json_is_array(item)) {
            size_t j;
            json_t *tok;
            json_array_foreach(item, j, tok) {
                if (!json_is_integer(tok)) {
                    snprintf(err, errlen, "token id lists in \"prompt\" must hold integers");
                    return -1;
                }
            }
            total += (long)json_array_size(item);
        } else {
            snprintf(err, errlen, "\"prompt\" items must be strings, integers or arrays");
            return -1;
        }
        if (total > 1000000000L) {
            snprintf(err, errlen, "\"prompt\" is too long");
            return -1;
        }
    }
    *out = total > 0 ? total : 1;
    return 0;
}

static int chat_prompt_tokens(json_t *messages, long *out, char *err, size_t errlen)
{
    if (!json_is_array(messages) || json_array_size(messages) == 0) {
        snprintf(err, errlen, "\"messages\" must be a non-empty array");
        return -1;
    }
    size_t chars = 0;
    size_t i;
    json_t *msg;
    json_array_foreach(messages, i, msg) {
        if (!json_is_object(msg) || !json_is_string(json_object_get(msg, "role"))) {
            snprintf(err, errlen, "each message must be an object with a string \"role\"");
            return -1;
        }
        json_t *content = json_object_get(msg, "content");
        if (json_is_string(content)) {
            chars += json_string_length(content);
        } else if (json_is_array(content)) {
            size_t j;
            json_t *part;
            json_array_foreach(content, j, part) {
                json_t *text = json_object_get(part, "text");
                if (json_is_string(text))
                    chars += json_string_length(text);
            }
        } else if (content && !json_is_null(content)) {
            snprintf(err, errlen, "message \"content\" must be a string, an array or null");
            return -1;
        }
    }
    size_t n = json_array_size(messages);
    *out = (long)(chars / CHARS_PER_TOKEN) + (long)n * CHAT_TOKENS_PER_MESSAGE;
    return 0;
}

/* Reads an optional non-negative integer field: 0 absent/null, 1 found, -1 bad. */
static int get_count(json_t *root, const char *key, long min, long *out, char *err,
                     size_t errlen)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < min ||
        json_integer_value(v) > 1000000000LL) {
        snprintf(err, errlen, "\"%s\" must be an integer >= %ld", key, min);
        return -1;
    }
    *out = (long)json_integer_value(v);
    return 1;
}

static int parse_root(enum fv_api api, json_t *root, const struct fv_parse_limits *lim,
                      struct fv_gen_request *out, char *err, size_t errlen)
{
    json_t *model = json_object_get(root, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) {
            snprintf(err, errlen, "\"model\" must be a string");
            return FV_OPENAI_EINVAL;
        }
        if (strcmp(json_string_value(model), lim->served_model) != 0) {
            /* vLLM's wording, so clients matching on it behave the same. */
            snprintf(err, errlen, "The model `%.200s` does not exist.", json_string_value(model));
            return FV_OPENAI_ENOMODEL;
        }
    }

    json_t *stream = json_object_get(root, "stream");
    if (stream && !json_is_null(stream) && !json_is_boolean(stream)) {
        snprintf(err, errlen, "\"stream\" must be a boolean");
        return FV_OPENAI_EINVAL;
    }
    out->stream = json_is_true(stream);
    json_t *opts = json_object_get(root, "stream_options");
    if (opts && !json_is_null(opts)) {
        if (!json_is_object(opts)) {
            snprintf(err, errlen, "\"stream_options\" must be an object");
            return FV_OPENAI_EINVAL;
        }
        out->include_usage = json_is_true(json_object_get(opts, "include_usage"));
    }

    out->max_tokens = lim->max_tokens_default;
    int rc = get_count(root, "max_tokens", 1, &out->max_tokens, err, errlen);
    if (rc < 0)
        return FV_OPENAI_EINVAL;
    if (api == FV_API_CHAT &&
        get_count(root, "max_completion_tokens", 1, &out->max_tokens, err, errlen) < 0)
        return FV_OPENAI_EINVAL;

    if (api == FV_API_COMPLETIONS) {
        json_t *prompt = json_object_get(root, "prompt");
        if (!prompt) {
            snprintf(err, errlen, "\"prompt\" is required");
            return FV_OPENAI_EINVAL;
        }
        if (completion_prompt_tokens(prompt, &out->prompt_tokens, err, errlen) < 0)
            return FV_OPENAI_EINVAL;
    } else if (chat_prompt_tokens(json_object_get(root, "messages"), &out->prompt_tokens, err,
                                  errlen) < 0) {
        return FV_OPENAI_EINVAL;
    }
    if (get_count(root, "thaw_prompt_tokens", 0, &out->prompt_tokens, err, errlen) < 0)
        return FV_OPENAI_EINVAL;

    if (out->prompt_tokens + out->max_tokens > lim->max_model_len) {
        snprintf(err, errlen,
                 "This model's maximum context length is %ld tokens. However, you requested "
                 "%ld tokens (%ld in the messages, %ld in the completion). Please reduce the "
                 "length of the messages or completion.",
                 lim->max_model_len, out->prompt_tokens + out->max_tokens, out->prompt_tokens,
                 out->max_tokens);
        return FV_OPENAI_ETOOLONG;
    }
    return FV_OPENAI_OK;
}

int fv_openai_parse(enum fv_api api, const char *body, size_t len,
                    const struct fv_parse_limits *lim, struct fv_gen_request *out, char *err,
                    size_t errlen)
{
    memset(out, 0, sizeof(*out));
    out->api = api;
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        snprintf(err, errlen, "invalid JSON body: %s (line %d column %d)", jerr.text, jerr.line,
                 jerr.column);
        return FV_OPENAI_EJSON;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        snprintf(err, errlen, "the JSON body must be an object");
        return FV_OPENAI_EJSON;
    }
    int rc = parse_root(api, root, lim, out, err, errlen);
    json_decref(root);
    return rc;
}

json_t *fv_openai_error(int status, const char *message)
{
    const char *type;
    switch (status) {
    case 400:
        type = "BadRequestError";
        break;
    case 404:
        type = "NotFoundError";
        break;
    case 413:
        type = "RequestEntityTooLarge";
        break;
    case 503:
        type = "ServiceUnavailableError";
        break;
    default:
        type = "InternalServerError";
        break;
    }
    return json_pack("{s:{s:s, s:s, s:n, s:i}}", "error", "message", message, "type", type,
                     "param", "code", status);
}

json_t *fv_openai_models(const char *model, long long created, long max_model_len)
{
    return json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:s, s:n, s:I}]}", "object", "list", "data",
                     "id", model, "object", "model", "created", (json_int_t)created, "owned_by",
                     "vllm", "root", model, "parent", "max_model_len",
                     (json_int_t)max_model_len);
}

static const char *const words[] = {
    " the",  " quick", " brown", " fox",    " jumps", " over", " a",     " lazy",
    " dog",  " while", " thaw",  " wakes",  " cold",  " model", " from", " zero",
};

const char *fv_openai_token_text(long k)
{
    if (k < 0)
        k = 0;
    return words[(size_t)k % (sizeof(words) / sizeof(words[0]))];
}

static json_t *usage_object(const struct fv_gen_request *g, long completion_tokens)
{
    return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)g->prompt_tokens,
                     "total_tokens", (json_int_t)(g->prompt_tokens + completion_tokens),
                     "completion_tokens", (json_int_t)completion_tokens);
}

json_t *fv_openai_response(const struct fv_gen_request *g, const char *id, long long created,
                           const char *model, long completion_tokens)
{
    size_t cap = 1;
    for (long k = 0; k < completion_tokens; k++)
        cap += strlen(fv_openai_token_text(k));
    json_t *usage = usage_object(g, completion_tokens);
    if (!usage)
        return NULL;
    char *text = thaw_malloc(cap);
    if (!text) {
        json_decref(usage);
        return NULL;
    }
    size_t off = 0;
    for (long k = 0; k < completion_tokens; k++) {
        const char *w = fv_openai_token_text(k);
        size_t wl = strlen(w);
        memcpy(text + off, w, wl);
        off += wl;
    }
    text[off] = '\0';
    json_t *doc;
    if (g->api == FV_API_CHAT)
        doc = json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{s:s, s:s}, s:n, s:s, s:n}], s:o}",
                        "id", id, "object", "chat.completion", "created", (json_int_t)created,
                        "model", model, "choices", "index", 0, "message", "role", "assistant",
                        "content", text, "logprobs", "finish_reason", "length", "stop_reason",
                        "usage", usage);
    else
        doc = json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:s, s:n, s:s, s:n}], s:o}", "id", id,
                        "object", "text_completion", "created", (json_int_t)created, "model",
                        model, "choices", "index", 0, "text", text, "logprobs", "finish_reason",
                        "length", "stop_reason", "usage", usage);
    thaw_free(text);
    return doc;
}

json_t *fv_openai_chunk(const struct fv_gen_request *g, const char *id, long long created,
                        const char *model, long k, int last)
{
    json_t *finish = last ? json_string("length") : json_null();
    if (!finish)
        return NULL;
    if (g->api == FV_API_CHAT)
        return json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{s:s}, s:n, s:o}]}", "id", id,
                         "object", "chat.completion.chunk", "created", (json_int_t)created,
                         "model", model, "choices", "index", 0, "delta", "content",
                         fv_openai_token_text(k), "logprobs", "finish_reason", finish);
    return json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:s, s:n, s:o, s:n}]}", "id", id, "object",
                     "text_completion", "created", (json_int_t)created, "model", model,
                     "choices", "index", 0, "text", fv_openai_token_text(k), "logprobs",
                     "finish_reason", finish, "stop_reason");
}

json_t *fv_openai_role_chunk(const char *id, long long created, const char *model)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{s:s, s:s}, s:n, s:n}]}", "id", id,
                     "object", "chat.completion.chunk", "created", (json_int_t)created, "model",
                     model, "choices", "index", 0, "delta", "role", "assistant", "content", "",
                     "logprobs", "finish_reason");
}

json_t *fv_openai_usage_chunk(const struct fv_gen_request *g, const char *id,
                              long long created, const char *model, long completion_tokens)
{
    json_t *usage = usage_object(g, completion_tokens);
    if (!usage)
        return NULL;
    return json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", id, "object",
                     g->api == FV_API_CHAT ? "chat.completion.chunk" : "text_completion",
                     "created", (json_int_t)created, "model", model, "choices", "usage", usage);
}
