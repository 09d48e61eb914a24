/* fv_options: command-line options of thaw-fake-vllm.
 *
 * One table row per option (name, type, default, bounds, target field, help)
 * drives parsing, defaults and --help, so they cannot drift apart. */
#ifndef THAW_FV_OPTIONS_H
#define THAW_FV_OPTIONS_H

#include <stddef.h>
#include <stdio.h>

struct fv_options {
    char *listen;             /* HOST:PORT; port 0 picks a free one */
    char *port_file;          /* NULL: do not write the port anywhere */
    char *model;              /* served model name */
    char *weights_file;       /* NULL: nothing to read at start */
    double weights_read_mbps; /* 0: read as fast as the disk allows */
    long load_delay_ms;
    char *while_loading;      /* "refuse" (bound, not listening, as vLLM) or "503" */
    double tokens_per_second; /* per request decode speed */
    long max_batch;           /* requests generating at once */
    long max_queue;           /* waiting requests beyond max_batch */
    long ttft_ms;             /* prefill time before the first token */
    long max_tokens_default;
    long max_model_len;       /* prompt + completion tokens allowed */
    long max_body_bytes;
    int exporter_only;
    double generation_rate;   /* exporter mode: tokens/s per model */
    char *models;             /* exporter mode: "a,b" or "a=100,b=2500" */
    char *log_level;
};

/* Fills every field with its default, then applies argv. Strings in *o are
 * owned by *o (release with fv_options_finish, also after a failure).
 * Returns 0 on success, 1 if --help was asked for (nothing else parsed), or
 * -1 with a message in err. */
int fv_options_parse(struct fv_options *o, int argc, char **argv, char *err, size_t errlen);

/* Frees the strings held by *o; safe on a zeroed or half-parsed struct. */
void fv_options_finish(struct fv_options *o);

/* Writes the usage text with every option and its default to out. */
void fv_options_usage(FILE *out, const char *prog);

#endif
