/* Target activator_config: the activator's JSON configuration
 * (activator/config.c config_parse), then what startup builds from it: the
 * route table, and every name and alias looked up through it.
 *
 * Input: the file's bytes. Checks: a config that parses holds what the header
 * promises (names unique and non-empty, exactly one of backend and
 * endpointsFile, a parsed backend host and port, healthPath starting with
 * '/', wakeWith naming known models); a failure says why in one line.
 * Then again with an allocation failing (in Thaw's code; jansson is kept on
 * plain malloc, see fuzz_jansson_no_oom). */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "alloc.h"
#include "config.h"
#include "fuzz.h"
#include "route.h"

static bool checks;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_logs();
    fuzz_jansson_no_oom();
    return 0;
}

static void check_config(const struct config *cfg)
{
    FUZZ_CHECK(cfg->nmodels > 0 && cfg->models, "no models");
    for (size_t i = 0; i < cfg->nmodels; i++) {
        const struct model_config *m = &cfg->models[i];
        FUZZ_CHECK(m->name && *m->name, "model %zu without a name", i);
        FUZZ_CHECK(config_model_index(cfg, m->name) == (int)i, "name '%s' not unique", m->name);
        FUZZ_CHECK(!m->backend != !m->endpoints_file, "model %zu: backend and endpointsFile", i);
        if (m->backend) {
            FUZZ_CHECK(m->backend_host && *m->backend_host, "backend without host");
            FUZZ_CHECK(m->backend_port >= 1 && m->backend_port <= 65535, "port %d",
                       m->backend_port);
            char host[256];
            int port = 0;
            FUZZ_CHECK(config_parse_backend_url(m->backend, host, sizeof(host), &port) == 0 &&
                           strcmp(host, m->backend_host) == 0 && port == m->backend_port,
                       "backend URL parses differently now");
        }
        FUZZ_CHECK(m->health_path && m->health_path[0] == '/', "healthPath");
        for (size_t k = 0; k < m->nwake_with; k++)
            FUZZ_CHECK(config_model_index(cfg, m->wake_with[k]) >= 0, "wakeWith unknown");
        FUZZ_CHECK(m->probe_max_ms >= m->probe_initial_ms, "probe bounds");
        FUZZ_CHECK(m->hold_timeout_ms >= 1 && m->max_held_requests >= 1, "hold limits");
    }
    for (size_t i = 0; i < cfg->napi_keys; i++)
        FUZZ_CHECK(cfg->api_keys[i].key && tier_to_str(cfg->api_keys[i].tier) != NULL,
                   "api key %zu", i);
    FUZZ_CHECK(cfg->limits.max_headers >= 1 && cfg->limits.max_headers <= 128, "maxHeaders");
    FUZZ_CHECK(cfg->limits.max_header_bytes >= 256, "maxHeaderBytes");
}

static void run(const uint8_t *data, size_t size, bool with_checks)
{
    checks = with_checks;
    char *text = malloc(size ? size : 1);
    if (!text)
        return;
    if (size)
        memcpy(text, data, size);
    char err[512];
    memset(err, 'X', sizeof(err));
    struct config *cfg = config_parse(text, size, err, sizeof(err));
    free(text);
    if (!cfg) {
        size_t elen = strnlen(err, sizeof(err));
        FUZZ_CHECK(elen > 0 && elen < sizeof(err), "failure without a reason");
        return;
    }
    if (checks)
        check_config(cfg);
    struct route_table *t = route_table_new(cfg);
    if (t) {
        for (size_t i = 0; i < cfg->nmodels; i++) {
            const struct model_config *m = &cfg->models[i];
            int a = route_table_lookup(t, m->name);
            FUZZ_CHECK(a == (int)i, "model '%s' routes to %d, not %zu", m->name, a, i);
            for (size_t k = 0; k < m->naliases; k++) {
                int x = route_table_lookup(t, m->aliases[k]);
                int y = route_by_name(cfg, m->aliases[k], strlen(m->aliases[k]));
                FUZZ_CHECK(x == y, "alias '%s': table %d, scan %d", m->aliases[k], x, y);
            }
            for (size_t k = 0; k < m->nhosts; k++) {
                int h = route_by_host(cfg, m->hosts[k], strlen(m->hosts[k]));
                FUZZ_CHECK(h >= -1 && h < (int)cfg->nmodels, "host index %d", h);
            }
        }
        route_table_free(t);
    } else {
        FUZZ_CHECK(!checks, "route_table_new failed");
    }
    config_free(cfg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_run_with_oom(run, data, size);
    return 0;
}
