/* fv_openai: the OpenAI-compatible request and response bodies vLLM speaks.
 *
 * No I/O: parses a request body into generation parameters and builds the
 * JSON documents (full responses, stream chunks, errors, model list). The
 * server layer decides when to send them. Returned json_t objects are new
 * references owned by the caller (json_decref). */
#ifndef THAW_FV_OPENAI_H
#define THAW_FV_OPENAI_H

#include <stddef.h>

#include <jansson.h>

enum fv_api { FV_API_COMPLETIONS, FV_API_CHAT };

/* Parse results; the server maps them to HTTP statuses. */
enum fv_openai_err {
    FV_OPENAI_OK = 0,
    FV_OPENAI_EJSON = -1,    /* body is not a JSON object */
    FV_OPENAI_EINVAL = -2,   /* a field has the wrong type or value */
    FV_OPENAI_ENOMODEL = -3, /* "model" names another model */
    FV_OPENAI_ETOOLONG = -4, /* prompt + max_tokens beyond max_model_len */
};

struct fv_gen_request {
    enum fv_api api;
    int stream;
    int include_usage; /* stream_options.include_usage */
    long max_tokens;
    long prompt_tokens;
};

struct fv_parse_limits {
    const char *served_model;
    long max_tokens_default;
    long max_model_len;
};

/* Parses a /v1/completions or /v1/chat/completions body. Prompt tokens are
 * estimated at ~4 characters per token unless the extension field
 * "thaw_prompt_tokens" gives them. A missing "model" means the served one (as
 * in vLLM). Returns FV_OPENAI_OK, or a negative fv_openai_err with a message
 * for the client in err. */
int fv_openai_parse(enum fv_api api, const char *body, size_t len,
                    const struct fv_parse_limits *lim, struct fv_gen_request *out, char *err,
                    size_t errlen);

/* {"error": {"message", "type", "param": null, "code"}}; type follows the
 * status (400 BadRequestError, 404 NotFoundError, ...). NULL when out of memory. */
json_t *fv_openai_error(int status, const char *message);

/* The /v1/models list with one model. */
json_t *fv_openai_models(const char *model, long long created, long max_model_len);

/* Text of generated token k (0-based): a space and a word, deterministic. */
const char *fv_openai_token_text(long k);

/* Full non-stream response with `completion_tokens` tokens of text and usage. */
json_t *fv_openai_response(const struct fv_gen_request *g, const char *id, long long created,
                           const char *model, long completion_tokens);

/* One stream chunk carrying token k's text; finish_reason "length" when last. */
json_t *fv_openai_chunk(const struct fv_gen_request *g, const char *id, long long created,
                        const char *model, long k, int last);

/* Chat streams open with a chunk whose delta holds only the role. */
json_t *fv_openai_role_chunk(const char *id, long long created, const char *model);

/* Final chunk with empty choices and usage (stream_options.include_usage). */
json_t *fv_openai_usage_chunk(const struct fv_gen_request *g, const char *id,
                              long long created, const char *model, long completion_tokens);

#endif
