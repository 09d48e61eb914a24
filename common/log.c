#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

static enum log_level current_level = LOG_LEVEL_INFO;
static log_sink_fn current_sink;
static void *current_sink_ud;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

int log_level_parse(const char *s, enum log_level *out)
{
    if (!s)
        return -1;
    for (size_t i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++) {
        if (strcmp(s, level_names[i]) == 0) {
            *out = (enum log_level)i;
            return 0;
        }
    }
    if (strcmp(s, "warning") == 0) {
        *out = LOG_LEVEL_WARN;
        return 0;
    }
    return -1;
}

const char *log_level_to_str(enum log_level level)
{
    if ((int)level < 0 || (size_t)level >= sizeof(level_names) / sizeof(level_names[0]))
        return "unknown";
    return level_names[level];
}

void log_set_level(enum log_level level) { current_level = level; }
enum log_level log_get_level(void) { return current_level; }

void log_set_sink(log_sink_fn fn, void *ud)
{
    current_sink = fn;
    current_sink_ud = ud;
}

void log_emit(enum log_level level, const char *event, const char *fmt, ...)
{
    if (level < current_level)
        return;
    char line[4096];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof(line), "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s event=%s",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, log_level_to_str(level), event);
    if (n < 0)
        return;
    size_t len = (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1;
    if (fmt && *fmt && len < sizeof(line) - 2) {
        line[len++] = ' ';
        va_list ap;
        va_start(ap, fmt);
        int m = vsnprintf(line + len, sizeof(line) - len, fmt, ap);
        va_end(ap);
        if (m > 0)
            len += (size_t)m < sizeof(line) - len ? (size_t)m : sizeof(line) - len - 1;
    }
    if (len >= sizeof(line) - 1)
        len = sizeof(line) - 2;
    line[len++] = '\n';
    line[len] = '\0';
    if (current_sink) {
        current_sink(current_sink_ud, line, len);
        return;
    }
    /* One write() per line keeps lines whole when several processes share stderr. */
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}

const char *log_quote(char *out, size_t outlen, const char *s)
{
    if (outlen == 0)
        return out;
    if (!s)
        s = "";
    int needs_quote = (*s == '\0');
    for (const char *p = s; *p && !needs_quote; p++) {
        unsigned char c = (unsigned char)*p;
        if (c <= ' ' || c == '"' || c == '=' || c == '\\' || c >= 0x7f)
            needs_quote = 1;
    }
    if (!needs_quote) {
        snprintf(out, outlen, "%s", s);
        return out;
    }
    size_t o = 0;
    if (outlen < 3) {
        out[0] = '\0';
        return out;
    }
    out[o++] = '"';
    for (const char *p = s; *p && o + 5 < outlen; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\') {
            out[o++] = '\\';
            out[o++] = (char)c;
        } else if (c == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
        } else if (c < ' ' || c == 0x7f) {
            o += (size_t)snprintf(out + o, outlen - o, "\\x%02x", c);
        } else {
            out[o++] = (char)c;
        }
    }
    out[o++] = '"';
    out[o] = '\0';
    return out;
}

const char *log_quote_url(char *out, size_t outlen, const char *url)
{
    if (!url)
        return log_quote(out, outlen, url);
    const char *auth = strstr(url, "://");
    auth = auth ? auth + 3 : url;
    size_t auth_len = strcspn(auth, "/?#"); /* the authority: [userinfo@]host[:port] */
    /* Our Redis URL parsers take the last '@' anywhere as the end of the
     * userinfo (a password may hold '/'): redact as far as they read it. */
    if (strncasecmp(url, "redis://", 8) == 0 || strncasecmp(url, "rediss://", 9) == 0)
        auth_len = strlen(auth);
    const char *at = NULL; /* the last '@': a password may hold one */
    for (size_t i = 0; i < auth_len; i++)
        if (auth[i] == '@')
            at = auth + i;
    const char *colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
    if (!colon)
        return log_quote(out, outlen, url);
    char redacted[1024];
    snprintf(redacted, sizeof(redacted), "%.*sREDACTED%s", (int)(colon + 1 - url), url, at);
    return log_quote(out, outlen, redacted);
}

static void libevent_log_cb(int severity, const char *msg)
{
    enum log_level level = severity >= EVENT_LOG_ERR    ? LOG_LEVEL_ERROR
                           : severity == EVENT_LOG_WARN ? LOG_LEVEL_WARN
                           : severity == EVENT_LOG_MSG  ? LOG_LEVEL_INFO
                                                        : LOG_LEVEL_DEBUG;
    if (level < log_get_level())
        return;
    char q[512];
    log_emit(level, "libevent", "msg=%s", log_quote(q, sizeof(q), msg));
}

void log_route_libevent(void) { event_set_log_callback(libevent_log_cb); }

bool log_throttle(int64_t *last_ms, int64_t now_ms)
{
    if (*last_ms && now_ms - *last_ms < LOG_THROTTLE_MS)
        return false;
    *last_ms = now_ms;
    return true;
}
