#include "fv_options.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

enum fv_opt_type { FV_OPT_STR, FV_OPT_LONG, FV_OPT_DOUBLE, FV_OPT_FLAG };

struct fv_opt_row {
    const char *name;
    enum fv_opt_type type;
    const char *def; /* parsed like a command-line value; NULL: unset */
    double min, max; /* numeric bounds, inclusive */
    size_t offset;
    const char *metavar;
    const char *help;
};

#define OFF(f) offsetof(struct fv_options, f)

static const struct fv_opt_row opt_rows[] = {
    {"listen", FV_OPT_STR, "127.0.0.1:8000", 0, 0, OFF(listen), "HOST:PORT",
     "address to serve on; port 0 picks a free port"},
    {"port-file", FV_OPT_STR, NULL, 0, 0, OFF(port_file), "FILE",
     "write the bound port to FILE once listening"},
    {"model", FV_OPT_STR, "fake-model", 0, 0, OFF(model), "NAME", "served model name"},
    {"weights-file", FV_OPT_STR, NULL, 0, 0, OFF(weights_file), "PATH",
     "file read completely at start, standing in for model weights"},
    {"weights-read-mbps", FV_OPT_DOUBLE, "0", 0, 1e6, OFF(weights_read_mbps), "N",
     "weights read rate in MB/s (10^6 bytes); 0 = unthrottled"},
    {"load-delay-ms", FV_OPT_LONG, "0", 0, 86400000, OFF(load_delay_ms), "N",
     "extra fixed load time after the weights are read"},
    {"while-loading", FV_OPT_STR, "refuse", 0, 0, OFF(while_loading), "MODE",
     "until loaded: refuse (the port is bound but not listening: connections are refused, "
     "as vLLM's, whose server listens once the engine is up) or 503 (answer 503 to everything)"},
    {"tokens-per-second", FV_OPT_DOUBLE, "50", 0.001, 1e6, OFF(tokens_per_second), "N",
     "decode speed of each request"},
    {"max-batch", FV_OPT_LONG, "8", 1, 100000, OFF(max_batch), "N",
     "requests generating at once; more wait in a FIFO queue"},
    {"max-queue", FV_OPT_LONG, "10000", 0, 1000000, OFF(max_queue), "N",
     "waiting requests allowed; beyond this 503"},
    {"ttft-ms", FV_OPT_LONG, "20", 0, 3600000, OFF(ttft_ms), "N",
     "prefill time before the first token"},
    {"max-tokens-default", FV_OPT_LONG, "16", 1, 1000000, OFF(max_tokens_default), "N",
     "max_tokens when a request gives none"},
    {"max-model-len", FV_OPT_LONG, "32768", 1, 10000000, OFF(max_model_len), "N",
     "prompt + completion tokens allowed per request (400 beyond)"},
    {"max-body-bytes", FV_OPT_LONG, "1048576", 1024, 1073741824, OFF(max_body_bytes), "N",
     "largest request body accepted (413 beyond)"},
    {"exporter-only", FV_OPT_FLAG, NULL, 0, 0, OFF(exporter_only), NULL,
     "serve only /metrics, /health and POST /admin/rate; no loading"},
    {"generation-rate", FV_OPT_DOUBLE, "0", 0, 1e9, OFF(generation_rate), "R",
     "exporter mode: generation tokens/s of each model without its own rate"},
    {"models", FV_OPT_STR, NULL, 0, 0, OFF(models), "LIST",
     "exporter mode: model names, \"a,b\" or with rates \"a=100,b=2500\"; none: just --model"},
    {"log-level", FV_OPT_STR, "info", 0, 0, OFF(log_level), "LEVEL",
     "debug, info, warn or error"},
};

#define N_ROWS (sizeof(opt_rows) / sizeof(opt_rows[0]))

static int set_value(struct fv_options *o, const struct fv_opt_row *row, const char *val,
                     char *err, size_t errlen)
{
    char *field = (char *)o + row->offset;
    char *end = NULL;
    switch (row->type) {
    case FV_OPT_STR: {
        char *copy = thaw_strdup(val);
        if (!copy) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        char **slot = (char **)(void *)field;
        thaw_free(*slot);
        *slot = copy;
        return 0;
    }
    case FV_OPT_LONG: {
        errno = 0;
        long v = strtol(val, &end, 10);
        if (errno || end == val || *end != '\0' || v < (long)row->min || v > (long)row->max) {
            snprintf(err, errlen, "--%s: want an integer in [%.0f, %.0f], got \"%s\"", row->name,
                     row->min, row->max, val);
            return -1;
        }
        *(long *)(void *)field = v;
        return 0;
    }
    case FV_OPT_DOUBLE: {
        errno = 0;
        double v = strtod(val, &end);
        /* The negated comparison also rejects NaN. */
        if (errno || end == val || *end != '\0' || !(v >= row->min && v <= row->max)) {
            snprintf(err, errlen, "--%s: want a number in [%g, %g], got \"%s\"", row->name,
                     row->min, row->max, val);
            return -1;
        }
        *(double *)(void *)field = v;
        return 0;
    }
    case FV_OPT_FLAG:
        *(int *)(void *)field = 1;
        return 0;
    }
    snprintf(err, errlen, "--%s: unknown option type", row->name);
    return -1;
}

static const struct fv_opt_row *find_row(const char *name, size_t len)
{
    for (size_t i = 0; i < N_ROWS; i++) {
        if (strlen(opt_rows[i].name) == len && strncmp(opt_rows[i].name, name, len) == 0)
            return &opt_rows[i];
    }
    return NULL;
}

int fv_options_parse(struct fv_options *o, int argc, char **argv, char *err, size_t errlen)
{
    memset(o, 0, sizeof(*o));
    for (size_t i = 0; i < N_ROWS; i++) {
        if (opt_rows[i].def && set_value(o, &opt_rows[i], opt_rows[i].def, err, errlen) < 0)
            return -1;
    }
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0)
            return 1;
        if (strncmp(arg, "--", 2) != 0) {
            snprintf(err, errlen, "unexpected argument \"%s\"", arg);
            return -1;
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
        const struct fv_opt_row *row = find_row(name, name_len);
        if (!row) {
            snprintf(err, errlen, "unknown option \"%s\" (see --help)", arg);
            return -1;
        }
        const char *val = NULL;
        if (row->type == FV_OPT_FLAG) {
            if (eq) {
                snprintf(err, errlen, "--%s takes no value", row->name);
                return -1;
            }
        } else if (eq) {
            val = eq + 1;
        } else if (i + 1 < argc) {
            val = argv[++i];
        } else {
            snprintf(err, errlen, "--%s needs a value", row->name);
            return -1;
        }
        if (set_value(o, row, val ? val : "", err, errlen) < 0)
            return -1;
    }
    return 0;
}

void fv_options_finish(struct fv_options *o)
{
    if (!o)
        return;
    for (size_t i = 0; i < N_ROWS; i++) {
        if (opt_rows[i].type == FV_OPT_STR) {
            char **slot = (char **)(void *)((char *)o + opt_rows[i].offset);
            thaw_free(*slot);
            *slot = NULL;
        }
    }
}

void fv_options_usage(FILE *out, const char *prog)
{
    fprintf(out, "usage: %s [options]\n\n"
                 "A stand-in for a vLLM OpenAI-compatible server: loads fake weights, then\n"
                 "serves /health, /v1/models, /v1/completions, /v1/chat/completions and\n"
                 "/metrics with vLLM's metric names.\n\noptions:\n",
            prog);
    for (size_t i = 0; i < N_ROWS; i++) {
        const struct fv_opt_row *r = &opt_rows[i];
        char head[64];
        snprintf(head, sizeof(head), "--%s%s%s", r->name, r->metavar ? " " : "",
                 r->metavar ? r->metavar : "");
        fprintf(out, "  %-28s %s", head, r->help);
        if (r->type != FV_OPT_FLAG)
            fprintf(out, " (default: %s)", r->def ? r->def : "none");
        fputc('\n', out);
    }
    fprintf(out, "  %-28s %s\n", "--help", "show this text");
}
