#include "admin.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>

#include "alloc.h"
#include "expo.h"
#include "http_conn_cap.h"
#include "log.h"
#include "model_name.h"
#include "proxy.h"

struct admin {
    struct evhttp *http;
    struct http_conn_cap *cap;
    struct proxy *px;
    int port;
};

static void reply_text(struct evhttp_request *req, int code, const char *reason,
                       const char *ctype, const char *text)
{
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        evhttp_send_error(req, 500, NULL);
        return;
    }
    evbuffer_add(b, text, strlen(text));
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", ctype);
    evhttp_send_reply(req, code, reason, b);
    evbuffer_free(b);
}

static void reply_json(struct evhttp_request *req, int code, const char *reason, json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) {
        evhttp_send_error(req, 500, NULL);
        return;
    }
    reply_text(req, code, reason, "application/json", s);
    thaw_free(s); /* jansson allocates through thaw_malloc (main.c) */
}

static void handle_wake(struct admin *a, struct evhttp_request *req, const char *name)
{
    if (evhttp_request_get_command(req) != EVHTTP_REQ_POST) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "POST");
        reply_text(req, 405, "Method Not Allowed", "text/plain", "use POST\n");
        return;
    }
    if (proxy_is_draining(a->px)) {
        /* A draining activator wakes nothing: 202 would say otherwise. */
        evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
        reply_json(req, 503, "Service Unavailable",
                   json_pack("{s:{s:s,s:s,s:s}}", "error", "message",
                             "the activator is shutting down", "type", "server_error", "code",
                             "draining"));
        return;
    }
    size_t decoded_len = 0;
    char *decoded = evhttp_uridecode(name, 0, &decoded_len);
    if (!decoded) {
        evhttp_send_error(req, 500, NULL);
        return;
    }
    /* %00 would cut the name short in C: "m1%00x" must not wake m1. */
    int rc = strlen(decoded) == decoded_len ? proxy_wake(a->px, decoded) : -1;
    if (rc < 0) {
        reply_json(req, 404, "Not Found",
                   json_pack("{s:{s:s,s:s,s:s}}", "error", "message", "no such model", "type",
                             "invalid_request_error", "code", "model_not_found"));
    } else {
        LOG_INFO("admin_wake", "model=%s", decoded);
        reply_json(req, 202, "Accepted", json_pack("{s:s}", "woken", decoded));
    }
    thaw_free(decoded); /* libevent allocates through thaw_malloc (main.c) */
}

static void admin_cb(struct evhttp_request *req, void *arg)
{
    struct admin *a = arg;
    const char *uri = evhttp_request_get_uri(req);
    /* Room for "/models/<name>/wake" with every byte of the longest name
     * percent-encoded. */
    char path[3 * MODEL_NAME_MAX + 64];
    size_t n = strcspn(uri, "?");
    if (n >= sizeof(path)) {
        evhttp_send_error(req, 414, NULL);
        return;
    }
    memcpy(path, uri, n);
    path[n] = '\0';
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    bool get = cmd == EVHTTP_REQ_GET || cmd == EVHTTP_REQ_HEAD;

    if (strncmp(path, "/models/", 8) == 0) {
        /* The name is everything up to the last "/wake": Hugging Face names
         * hold a '/' (org/model), sent as is or as %2F. */
        char *name = path + 8;
        size_t len = strlen(name);
        if (len > 5 && strcmp(name + len - 5, "/wake") == 0) {
            name[len - 5] = '\0';
            handle_wake(a, req, name);
            return;
        }
        evhttp_send_error(req, 404, NULL);
        return;
    }
    if (!get) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET");
        reply_text(req, 405, "Method Not Allowed", "text/plain", "use GET\n");
        return;
    }
    bool page = strcmp(path, "/metrics") == 0 || strcmp(path, "/models") == 0;
    if (page && http_conn_cap_unsent_bytes(a->cap) > HTTP_CONN_CAP_MAX_UNSENT_BYTES) {
        /* Pages answered before still wait for clients that do not read
         * them: each new one would be held in memory too. */
        evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
        reply_text(req, 503, "Service Unavailable", "text/plain",
                   "busy: the pages answered before wait for clients that do not read them\n");
        return;
    }
    if (strcmp(path, "/metrics") == 0) {
        struct evbuffer *b = evbuffer_new();
        if (!b) {
            evhttp_send_error(req, 500, NULL);
            return;
        }
        proxy_write_metrics(a->px, b);
        http_conn_cap_write_metrics(a->cap, b, "thaw_activator_admin",
                                    "admin (/metrics, /models, /healthz, /readyz)");
        evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                          EXPO_CONTENT_TYPE);
        evhttp_send_reply(req, 200, "OK", b);
        evbuffer_free(b);
    } else if (strcmp(path, "/healthz") == 0) {
        reply_text(req, 200, "OK", "text/plain", "ok\n");
    } else if (strcmp(path, "/readyz") == 0) {
        if (proxy_is_draining(a->px) || proxy_port(a->px) < 0)
            reply_text(req, 503, "Service Unavailable", "text/plain", "draining\n");
        else
            reply_text(req, 200, "OK", "text/plain", "ready\n");
    } else if (strcmp(path, "/models") == 0) {
        json_t *j = proxy_models_json(a->px);
        reply_json(req, j ? 200 : 500, j ? "OK" : "Internal Server Error", j);
    } else {
        evhttp_send_error(req, 404, NULL);
    }
}

struct admin *admin_new(struct event_base *base, struct proxy *px, const char *host, int port,
                        int max_connections, char *err, size_t errlen)
{
    struct admin *a = thaw_calloc(1, sizeof(*a));
    if (!a) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    a->px = px;
    a->http = evhttp_new(base);
    if (!a->http) {
        snprintf(err, errlen, "out of memory");
        thaw_free(a);
        return NULL;
    }
    a->cap =
        http_conn_cap_new(base, a->http, max_connections, HTTP_CONN_CAP_EVICT_IDLE_MS, "admin");
    if (!a->cap) {
        snprintf(err, errlen, "out of memory");
        admin_free(a);
        return NULL;
    }
    evhttp_set_allowed_methods(a->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST);
    evhttp_set_max_headers_size(a->http, 16384);
    evhttp_set_max_body_size(a->http, 65536);
    evhttp_set_timeout(a->http, 30);
    evhttp_set_gencb(a->http, admin_cb, a);
    struct evhttp_bound_socket *s = evhttp_bind_socket_with_handle(a->http, host, (uint16_t)port);
    if (!s) {
        snprintf(err, errlen, "admin bind %s:%d: %s", host, port, strerror(errno));
        admin_free(a);
        return NULL;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    a->port = port;
    if (getsockname(evhttp_bound_socket_get_fd(s), (struct sockaddr *)&ss, &sl) == 0) {
        a->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)(void *)&ss)->sin6_port)
                                           : ntohs(((struct sockaddr_in *)(void *)&ss)->sin_port);
    }
    return a;
}

void admin_free(struct admin *a)
{
    if (!a)
        return;
    if (a->http)
        evhttp_free(a->http);
    http_conn_cap_free(a->cap); /* after evhttp_free: its connections report here */
    thaw_free(a);
}

int admin_port(const struct admin *a) { return a->port; }
