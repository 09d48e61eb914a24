/* options: table-driven settings for the binaries.
 *
 * One row per option gives its flag, type, default, bounds, help text and the
 * field it fills; the same table serves command-line flags (`--name VALUE` or
 * `--name=VALUE`), environment variables (THAW_NAME with '-' as '_', upper
 * case), keys of a JSON config file, and `--help`.
 * Precedence: default < config file < environment < flag. */
#ifndef THAW_OPTIONS_H
#define THAW_OPTIONS_H

#include <stddef.h>
#include <stdio.h>

enum opt_type {
    OPT_STRING, /* char * field, owned by the target (options_free releases it) */
    OPT_INT,    /* long field, within [min, max] */
    OPT_DOUBLE, /* double field, within [min, max] */
    OPT_LOG_LEVEL, /* enum log_level field ("debug", "info", "warn", "error") */
};

struct opt_def {
    const char *name;   /* flag name without dashes, e.g. "prometheus-url" */
    enum opt_type type;
    size_t offset;      /* offsetof(target struct, field) */
    const char *def;    /* default as text; NULL means unset (strings only) */
    double min, max;    /* bounds for OPT_INT/OPT_DOUBLE */
    const char *help;
    const char *json_key; /* key in the config file's top-level object, or NULL */
};

enum options_result { OPTIONS_OK = 0, OPTIONS_EXIT_OK = 1, OPTIONS_ERROR = -1 };

/* Fills target from defaults, the config file, the environment and argv, in
 * that order. The config file is the value of the OPT_STRING option named
 * config_option (e.g. "config"), taken from the environment or argv before
 * the rest; NULL means no config file. Unknown keys in the file are an error
 * (typos must not pass silently), except those listed in `extra_json_keys`
 * (NULL-terminated, may be NULL) that the caller reads itself.
 * `--help` prints usage to `help_out` and returns OPTIONS_EXIT_OK. On a bad
 * value or unknown flag returns OPTIONS_ERROR with err naming the option and
 * its source (e.g. "--listen: expected HOST:PORT", "THAW_LOG_LEVEL: unknown
 * level 'loud'"). Values of type OPT_STRING are copied. */
enum options_result options_parse(const struct opt_def *defs, size_t ndefs, void *target,
                                  int argc, char **argv, const char *prog, const char *summary,
                                  const char *config_option, const char *const *extra_json_keys,
                                  FILE *help_out, char *err, size_t errlen);

/* Releases the OPT_STRING fields. Accepts NULL target. */
void options_free(const struct opt_def *defs, size_t ndefs, void *target);

/* Splits "host:port" or "[v6]:port" into host (copied into host, hostlen) and
 * port. Returns 0, or -1 when malformed or the port is outside 0..65535. */
int options_split_hostport(const char *s, char *host, size_t hostlen, int *port);

#endif
