/* thaw-activator: the scale-to-zero HTTP proxy.
 *
 * Wiring only: options, the event loop, the proxy, the admin port, the Redis
 * link, signals (SIGTERM/SIGINT drain, SIGHUP reload) and the config file
 * watch (a changed file is reloaded as on SIGHUP). */
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>
#include <jansson.h>

#include "admin.h"
#include "alloc.h"
#include "config.h"
#include "fd_limit.h"
#include "log.h"
#include "options.h"
#include "proxy.h"
#include "redis_link.h"

struct settings {
    char *config;
    char *listen;
    char *admin_listen;
    long admin_max_connections;
    char *redis_url;
    char *instance_id;
    enum log_level log_level;
    long redis_timeout_ms;
    char *dns_server;
    long config_poll_ms;
    char *peer_group;
    char *scaler_wake_url;
    long scaler_wake_timeout_ms;
    long access_log;
};

#define S(f) offsetof(struct settings, f)
static const struct opt_def option_defs[] = {
    {"config", OPT_STRING, S(config), NULL, 0, 0, "JSON config file (models, limits) - required",
     NULL},
    {"listen", OPT_STRING, S(listen), "0.0.0.0:8080", 0, 0,
     "proxy address, HOST:PORT (port 0 picks a free one)", NULL},
    {"admin-listen", OPT_STRING, S(admin_listen), "0.0.0.0:8081", 0, 0,
     "admin address for /metrics, /healthz, /readyz, /models", NULL},
    {"admin-max-connections", OPT_INT, S(admin_max_connections), "256", 1, 1000000,
     "connections the admin port holds open at once; one more closes the connection idle "
     "longest (2 s at least) or, with none idle, is answered 503 and closed "
     "(scrapes and kubelet probes each take one for a moment)", NULL},
    {"redis-url", OPT_STRING, S(redis_url), NULL, 0, 0,
     "Redis URL redis://[:password@]host[:port][/db]; unset: no wake signals or held counts",
     NULL},
    {"instance-id", OPT_STRING, S(instance_id), NULL, 0, 0,
     "this instance's field in thaw:held:<model> (default: the host name)", NULL},
    {"log-level", OPT_LOG_LEVEL, S(log_level), "info", 0, 0, "debug, info, warn or error", NULL},
    {"redis-timeout-ms", OPT_INT, S(redis_timeout_ms), "1000", 10, 600000,
     "a Redis connect or command not answered this fast drops the connection", NULL},
    {"config-poll-ms", OPT_INT, S(config_poll_ms), "2000", 0, 3600000,
     "check the config file this often and reload it when it changed, as on SIGHUP (a "
     "Kubernetes ConfigMap edit); 0: only on SIGHUP", NULL},
    {"peer-group", OPT_STRING, S(peer_group), "default", 0, 0,
     "activators in the same group (and Redis) share each endpoint's "
     "maxConcurrencyPerEndpoint: each takes ceil(cap / live members); give activators in "
     "front of other backends a group of their own", NULL},
    {"scaler-wake-url", OPT_STRING, S(scaler_wake_url), NULL, 0, 0,
     "http://HOST:PORT of thaw-scaler's HTTP port (a headless Service: every address); each "
     "wake is also POSTed there, and renewed every second while Redis is down (unset: wakes "
     "go through Redis only)", NULL},
    {"scaler-wake-timeout-ms", OPT_INT, S(scaler_wake_timeout_ms), "2000", 10, 600000,
     "one wake POST's limit, connect to status line", NULL},
    {"access-log", OPT_INT, S(access_log), "0", 0, 1,
     "1: log one event=access line per finished request (model, request line, status, "
     "outcome, client, endpoint, held and response-head times, X-Request-Id)", NULL},
    {"dns-server", OPT_STRING, S(dns_server), NULL, 0, 0,
     "nameserver IP[:PORT] for backend host names instead of /etc/resolv.conf's (unset: the "
     "system's)", NULL},
};
#define NDEFS (sizeof(option_defs) / sizeof(option_defs[0]))

struct app {
    struct event_base *base;
    struct settings s;
    struct proxy *px;
    struct admin *admin;
    struct redis_link *redis;
    struct event *sig_term, *sig_int, *sig_hup;
    struct event *hard_stop;
    struct event *config_watch;
    struct stat config_seen; /* the file as last loaded or rejected */
    bool config_seen_ok;
};

static void drained(void *ud)
{
    struct app *app = ud;
    /* A few more loop turns for queued Redis commands (the held fields' HDEL) to
     * reach the socket; nothing else is left to serve. */
    struct timeval flush = {0, 100000};
    event_base_loopexit(app->base, &flush);
}

static void hard_stop_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct app *app = arg;
    LOG_WARN("drain_forced_exit", NULL);
    event_base_loopexit(app->base, NULL);
}

static void on_term(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct app *app = arg;
    if (proxy_is_draining(app->px))
        return;
    LOG_INFO("signal", "signal=%s action=drain", fd == SIGINT ? "SIGINT" : "SIGTERM");
    if (app->config_watch)
        event_del(app->config_watch); /* a draining proxy takes no new config */
    /* Belt and braces: the drain deadline answers everyone; this only bounds
     * a peer that never reads its answer. */
    app->hard_stop = evtimer_new(app->base, hard_stop_cb, app);
    if (app->hard_stop) {
        long ms = proxy_drain_timeout_ms(app->px) + 5000;
        struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
        evtimer_add(app->hard_stop, &tv);
    }
    proxy_drain(app->px, drained, app);
}

static void config_remember(struct app *app)
{
    app->config_seen_ok = stat(app->s.config, &app->config_seen) == 0;
}

static void reload_config(struct app *app)
{
    char err[512];
    /* Remembered before reading: a change while it is read is seen next time. */
    config_remember(app);
    struct config *cfg = config_load(app->s.config, err, sizeof(err));
    if (!cfg) {
        LOG_ERROR("reload_rejected", "err=\"%s\"", err);
        return;
    }
    proxy_reload(app->px, cfg);
}

static void on_hup(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    reload_config(arg);
}

/* A ConfigMap volume swaps a symlink: stat follows it, so a new file shows as
 * a new inode, size or modification time. A file that is gone or unreadable
 * is left alone (the old config stays) until it changes again. */
static void on_config_watch(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct app *app = arg;
    struct stat st;
    if (stat(app->s.config, &st) != 0)
        return;
    const struct stat *o = &app->config_seen;
    if (app->config_seen_ok && st.st_ino == o->st_ino && st.st_dev == o->st_dev &&
        st.st_size == o->st_size && st.st_mtim.tv_sec == o->st_mtim.tv_sec &&
        st.st_mtim.tv_nsec == o->st_mtim.tv_nsec)
        return;
    LOG_INFO("config_changed", "path=%s", app->s.config);
    reload_config(app);
}

/* The group names a Redis key: keep it short and printable. */
static bool peer_group_valid(const char *g)
{
    size_t n = strlen(g);
    if (n == 0 || n > 200)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = g[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}

static int split(const char *what, const char *hp, char *host, size_t hl, int *port)
{
    if (options_split_hostport(hp, host, hl, port) < 0) {
        fprintf(stderr, "thaw-activator: --%s: expected HOST:PORT, got '%s'\n", what, hp);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    /* libevent's and jansson's own allocations go through the same wrapper
     * as ours (hiredis 0.14 has no such hook). Must precede any use. */
    event_set_mem_functions(thaw_malloc, thaw_realloc, thaw_free);
    /* Buffers come and go per request; without this glibc gives the heap top
     * back to the kernel and takes it again thousands of times a second. */
    mallopt(M_TRIM_THRESHOLD, 32 << 20);
    mallopt(M_TOP_PAD, 4 << 20);
    json_set_alloc_funcs(thaw_malloc, thaw_free);
    long fd_limit = fd_limit_raise();
    struct app app;
    memset(&app, 0, sizeof(app));
    char err[512];
    enum options_result r =
        options_parse(option_defs, NDEFS, &app.s, argc, argv, "thaw-activator",
                      "Holds requests for scaled-to-zero models, wakes them, and proxies.", NULL,
                      NULL, stdout, err, sizeof(err));
    if (r == OPTIONS_EXIT_OK) {
        options_free(option_defs, NDEFS, &app.s);
        return 0;
    }
    if (r != OPTIONS_OK) {
        fprintf(stderr, "thaw-activator: %s\n", err);
        options_free(option_defs, NDEFS, &app.s);
        return 2;
    }
    log_set_level(app.s.log_level);
    if (!peer_group_valid(app.s.peer_group)) {
        fprintf(stderr, "thaw-activator: --peer-group: expected 1-200 of A-Z a-z 0-9 . _ -, got "
                        "'%s'\n", app.s.peer_group);
        options_free(option_defs, NDEFS, &app.s);
        return 2;
    }
    int rc = 1;
    char lhost[256], ahost[256];
    int lport, aport;
    if (!app.s.config) {
        fprintf(stderr, "thaw-activator: --config: required\n");
        rc = 2;
        goto out;
    }
    if (split("listen", app.s.listen, lhost, sizeof(lhost), &lport) < 0 ||
        split("admin-listen", app.s.admin_listen, ahost, sizeof(ahost), &aport) < 0) {
        rc = 2;
        goto out;
    }
    char host_id[256] = "thaw-activator";
    if (!app.s.instance_id) {
        if (gethostname(host_id, sizeof(host_id) - 1) < 0)
            snprintf(host_id, sizeof(host_id), "thaw-activator");
        host_id[sizeof(host_id) - 1] = '\0';
    }
    const char *instance = app.s.instance_id ? app.s.instance_id : host_id;

    config_remember(&app);
    struct config *cfg = config_load(app.s.config, err, sizeof(err));
    if (!cfg) {
        fprintf(stderr, "thaw-activator: config %s\n", err);
        rc = 2;
        goto out;
    }
    signal(SIGPIPE, SIG_IGN);
    log_route_libevent();
    app.base = event_base_new();
    if (!app.base) {
        config_free(cfg);
        fprintf(stderr, "thaw-activator: cannot create the event loop\n");
        goto out;
    }
    app.px = proxy_new(app.base, cfg, app.s.dns_server, err, sizeof(err));
    if (!app.px) {
        fprintf(stderr, "thaw-activator: %s\n", err);
        goto out;
    }
    proxy_set_access_log(app.px, app.s.access_log != 0);
    if (app.s.scaler_wake_url &&
        proxy_set_scaler_wake(app.px, app.s.scaler_wake_url, instance,
                              app.s.scaler_wake_timeout_ms, err, sizeof(err)) < 0) {
        fprintf(stderr, "thaw-activator: --scaler-wake-url: %s\n", err);
        rc = 2;
        goto out;
    }
    if (app.s.redis_url) {
        app.redis = redis_link_new(app.base, app.s.redis_url, instance, app.s.redis_timeout_ms,
                                   proxy_redis_state, app.px, err, sizeof(err));
        if (!app.redis) {
            fprintf(stderr, "thaw-activator: --redis-url: %s\n", err);
            rc = 2;
            goto out;
        }
        proxy_set_redis(app.px, app.redis, app.s.peer_group);
    } else {
        LOG_WARN("no_redis", "reason=\"--redis-url not set: wake signals and held counts are off\"");
    }
    if (proxy_listen(app.px, lhost, lport, err, sizeof(err)) < 0) {
        fprintf(stderr, "thaw-activator: --listen: %s\n", err);
        goto out;
    }
    app.admin = admin_new(app.base, app.px, ahost, aport, (int)app.s.admin_max_connections, err,
                          sizeof(err));
    if (!app.admin) {
        fprintf(stderr, "thaw-activator: --admin-listen: %s\n", err);
        goto out;
    }
    app.sig_term = evsignal_new(app.base, SIGTERM, on_term, &app);
    app.sig_int = evsignal_new(app.base, SIGINT, on_term, &app);
    app.sig_hup = evsignal_new(app.base, SIGHUP, on_hup, &app);
    if (!app.sig_term || !app.sig_int || !app.sig_hup || evsignal_add(app.sig_term, NULL) < 0 ||
        evsignal_add(app.sig_int, NULL) < 0 || evsignal_add(app.sig_hup, NULL) < 0) {
        fprintf(stderr, "thaw-activator: cannot install signal handlers\n");
        goto out;
    }
    if (app.s.config_poll_ms > 0) {
        app.config_watch = event_new(app.base, -1, EV_PERSIST, on_config_watch, &app);
        struct timeval tv = {app.s.config_poll_ms / 1000, (app.s.config_poll_ms % 1000) * 1000};
        if (!app.config_watch || event_add(app.config_watch, &tv) < 0) {
            fprintf(stderr, "thaw-activator: cannot watch the config file\n");
            goto out;
        }
    }
    LOG_INFO("listening", "proxy_port=%d admin_port=%d instance=%s models=%zu fd_limit=%ld",
             proxy_port(app.px), admin_port(app.admin), instance, proxy_model_count(app.px),
             fd_limit);
    event_base_dispatch(app.base);
    LOG_INFO("exit", NULL);
    rc = 0;
out:
    admin_free(app.admin);
    proxy_free(app.px);
    redis_link_free(app.redis);
    if (app.sig_term)
        event_free(app.sig_term);
    if (app.sig_int)
        event_free(app.sig_int);
    if (app.sig_hup)
        event_free(app.sig_hup);
    if (app.hard_stop)
        event_free(app.hard_stop);
    if (app.config_watch)
        event_free(app.config_watch);
    if (app.base)
        event_base_free(app.base);
    options_free(option_defs, NDEFS, &app.s);
    return rc;
}
