/* Target options_config: the JSON config file of the binaries
 * (common/options.c, options_parse with a config file). options.c reads the
 * file itself (json_load_file), so the input is written to a file in a
 * private temporary directory first.
 *
 * The option table has one row of each kind thaw-scaler's table has (main.c
 * keeps its own static): strings with and without a default, whole numbers
 * and doubles with bounds, a log level, a flag-only option, and an extra key
 * the caller reads itself. Checks: after OPTIONS_OK every value is within its
 * bounds; after OPTIONS_ERROR the reason is set; HOST:PORT values split as
 * main.c splits them. Then again with an allocation failing. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "alloc.h"
#include "fuzz.h"
#include "log.h"
#include "options.h"

struct settings {
    char *listen;
    char *url;
    char *config;
    char *query;
    char *no_default;
    char *flag_only;
    enum log_level log_level;
    long interval_ms;
    long max_connections;
    double staleness;
    double window;
};

#define S(f) offsetof(struct settings, f)
static const struct opt_def defs[] = {
    {"listen", OPT_STRING, S(listen), "0.0.0.0:9090", 0, 0, "address", "listen"},
    {"prometheus-url", OPT_STRING, S(url), "http://127.0.0.1:9090", 0, 0, "url", "prometheusUrl"},
    {"config", OPT_STRING, S(config), NULL, 0, 0, "config file", NULL},
    {"token-rate-query", OPT_STRING, S(query), "sum(rate(x[1m]))", 0, 0, "promql",
     "tokenRateQuery"},
    {"instance-id", OPT_STRING, S(no_default), NULL, 0, 0, "no default", "instanceId"},
    {"flag-only", OPT_STRING, S(flag_only), "x", 0, 0, "not in the file", NULL},
    {"log-level", OPT_LOG_LEVEL, S(log_level), "info", 0, 0, "level", "logLevel"},
    {"prometheus-interval-ms", OPT_INT, S(interval_ms), "5000", 100, 3600000, "ms",
     "prometheusIntervalMs"},
    {"max-connections", OPT_INT, S(max_connections), "10000", 1, 1000000, "n", "maxConnections"},
    {"staleness-limit-seconds", OPT_DOUBLE, S(staleness), "60", 1, 86400, "s",
     "stalenessLimitSeconds"},
    {"scale-down-stabilization-seconds", OPT_DOUBLE, S(window), "300", 0, 86400, "s",
     "scaleDownStabilizationSeconds"},
};
#undef S
#define NDEFS (sizeof(defs) / sizeof(defs[0]))

static char dir[256];
static char path[300];
static bool checks;

static void cleanup(void)
{
    if (path[0])
        unlink(path);
    if (dir[0])
        rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_logs();
    fuzz_jansson_no_oom();
    /* Settings must come from the file alone. */
    for (size_t i = 0; i < NDEFS; i++) {
        char env[128];
        size_t o = (size_t)snprintf(env, sizeof(env), "THAW_");
        for (const char *p = defs[i].name; *p && o + 1 < sizeof(env); p++)
            env[o++] = *p == '-' ? '_' : (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
        env[o] = '\0';
        unsetenv(env);
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof(dir), "%s/thaw-fuzz-options-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
        fuzz_fail(__FILE__, __LINE__, "mkdtemp %s failed", dir);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    atexit(cleanup);
    return 0;
}

static void check_hostport(const char *s)
{
    char host[256];
    int port = -1;
    if (options_split_hostport(s, host, sizeof(host), &port) != 0)
        return;
    FUZZ_CHECK(port >= 0 && port <= 65535, "port %d from '%s'", port, s);
    FUZZ_CHECK(strlen(host) > 0 && strlen(host) < sizeof(host), "host from '%s'", s);
    FUZZ_CHECK(strstr(s, host) != NULL, "host '%s' not in '%s'", host, s);
}

static void run(const uint8_t *data, size_t size, bool with_checks)
{
    checks = with_checks;
    FILE *f = fopen(path, "wb");
    if (!f)
        fuzz_fail(__FILE__, __LINE__, "cannot write %s", path);
    bool ok = fwrite(data, 1, size, f) == size;
    if (fclose(f) != 0 || !ok)
        fuzz_fail(__FILE__, __LINE__, "cannot write %s", path);
    struct settings s;
    memset(&s, 0, sizeof(s));
    char *argv[] = {"fuzz", "--config", path, NULL};
    static const char *const extra[] = {"models", NULL};
    char err[512];
    memset(err, 'X', sizeof(err));
    enum options_result r = options_parse(defs, NDEFS, &s, 3, argv, "fuzz", "fuzz", "config",
                                          extra, stdout, err, sizeof(err));
    if (r == OPTIONS_ERROR) {
        size_t elen = strnlen(err, sizeof(err));
        FUZZ_CHECK(elen > 0 && elen < sizeof(err), "failure without a reason");
    } else if (checks) {
        FUZZ_CHECK(r == OPTIONS_OK, "result %d", (int)r);
        FUZZ_CHECK(s.listen && s.url && s.query && s.flag_only && s.config, "string unset");
        FUZZ_CHECK(strcmp(s.flag_only, "x") == 0, "flag-only option set from the file");
        FUZZ_CHECK(strcmp(s.config, path) == 0, "config path changed by the file");
        FUZZ_CHECK(s.interval_ms >= 100 && s.interval_ms <= 3600000, "interval %ld",
                   s.interval_ms);
        FUZZ_CHECK(s.max_connections >= 1 && s.max_connections <= 1000000, "max %ld",
                   s.max_connections);
        FUZZ_CHECK(s.staleness >= 1 && s.staleness <= 86400, "staleness %g", s.staleness);
        FUZZ_CHECK(s.window >= 0 && s.window <= 86400, "window %g", s.window);
        FUZZ_CHECK(log_level_to_str(s.log_level) != NULL, "log level");
        check_hostport(s.listen);
    }
    options_free(defs, NDEFS, &s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_run_with_oom(run, data, size);
    return 0;
}
