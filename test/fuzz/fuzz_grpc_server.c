/* Target grpc_server: the whole gRPC server path of thaw-scaler without a
 * real client: bytes go over a loopback TCP connection into grpc_server
 * (nghttp2 session, gRPC framing, method dispatch) and the scaler's real
 * handlers (service.c: protobuf decoding, resolve(), replies, streams), on a
 * scaler_state of its own. Everything is created per input, so runs do not
 * depend on each other.
 *
 * grpc_server only takes connections from its listener (no way to hand it a
 * socketpair), hence loopback TCP: the client resets its end at the close
 * (SO_LINGER 0), which leaves no TIME_WAIT behind however many runs there are.
 *
 * Input: byte 0 sets options (bit 0: --redis-key-prefix thaw:queue:, bit 1: a
 * namespace allow-list, bit 2: a 1 KiB message limit, bit 3: a 4 KiB output
 * bound); the rest is what a client sends after the connection preface and an
 * empty SETTINGS frame, which the harness sends first. Checks: no sanitizer
 * report, the server ends the connection when the client resets it, and the
 * service forgets every stream. Then again with an allocation failing. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "alloc.h"
#include "clock.h"
#include "fuzz.h"
#include "grpc_server.h"
#include "service.h"
#include "state.h"

#define MAX_INPUT (64 * 1024)

static const uint8_t preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                                 "\x00\x00\x00\x04\x00\x00\x00\x00\x00"; /* empty SETTINGS */

struct client {
    int fd;
    struct event *ev;
    uint8_t *out;
    size_t out_len, out_off;
    size_t got;
    bool closed;
};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_logs();
    return 0;
}

static void client_read(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct client *c = arg;
    uint8_t buf[16384];
    for (;;) {
        ssize_t r = read(fd, buf, sizeof(buf));
        if (r > 0) {
            c->got += (size_t)r;
            continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        c->closed = true; /* EOF or reset */
        event_del(c->ev);
        return;
    }
}

static void client_write(struct client *c)
{
    while (c->out_off < c->out_len) {
        ssize_t w = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);
        if (w > 0) {
            c->out_off += (size_t)w;
            continue;
        }
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        c->out_off = c->out_len; /* the server is gone: nothing more to send */
        return;
    }
}

/* The server's end of our connection: the socket whose peer is our port. */
static int find_server_fd(int client_fd)
{
    struct sockaddr_in me;
    socklen_t len = sizeof(me);
    if (getsockname(client_fd, (struct sockaddr *)&me, &len) != 0)
        return -1;
    for (int fd = 0; fd < 4096; fd++) {
        struct sockaddr_in peer;
        socklen_t pl = sizeof(peer);
        if (fd == client_fd || getpeername(fd, (struct sockaddr *)&peer, &pl) != 0)
            continue;
        if (peer.sin_family == AF_INET && peer.sin_port == me.sin_port &&
            peer.sin_addr.s_addr == me.sin_addr.s_addr)
            return fd;
    }
    return -1;
}

/* Nonblocking connect: libFuzzer's SIGALRM (its -timeout clock) interrupts a
 * blocking one with EINTR. The listener's backlog completes it at once. */
static int connect_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        fuzz_fail(__FILE__, __LINE__, "socket: %s (descriptor leak?)", strerror(errno));
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        if (errno != EINPROGRESS && errno != EINTR)
            fuzz_fail(__FILE__, __LINE__, "connect: %s", strerror(errno));
        struct pollfd p = {fd, POLLOUT, 0};
        int r;
        while ((r = poll(&p, 1, 5000)) < 0 && errno == EINTR)
            ;
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        if (r != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr != 0)
            fuzz_fail(__FILE__, __LINE__, "connect: %s", r == 1 ? strerror(soerr) : "timeout");
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static void run(const uint8_t *data, size_t size, bool checks)
{
    uint8_t opts = size ? data[0] : 0;
    const uint8_t *in = size ? data + 1 : data;
    size_t in_len = size ? size - 1 : 0;

    struct event_base *base = event_base_new();
    if (!base)
        fuzz_fail(__FILE__, __LINE__, "event_base_new failed");
    struct scaler_service *svc = scaler_service_new();
    struct scaler_state_config sc = {.staleness_limit_ms = 60000,
                                     .scale_down_window_ms = 300000,
                                     .bursty_scale_down_window_ms = 300000,
                                     .wake_hold_ms = 5000,
                                     .target_expiry_ms = 3600000};
    struct scaler_state *st =
        svc ? scaler_state_new(&sc, clock_mono_ms(), scaler_service_on_change, svc) : NULL;
    struct grpc_server *srv = NULL;
    struct client c;
    memset(&c, 0, sizeof(c));
    c.fd = -1;
    if (!svc || !st)
        goto out;
    scaler_service_attach(svc, st);
    if (scaler_service_set_tenancy(svc, (opts & 1) ? "thaw:queue:" : "",
                                   (opts & 2) ? "default,team-a" : "") != 0)
        goto out;
    size_t nmethods = 0;
    const struct grpc_method *methods = scaler_service_methods(svc, &nmethods);
    struct grpc_server_limits limits;
    memset(&limits, 0, sizeof(limits));
    if (opts & 4)
        limits.max_message = 1024;
    if (opts & 8)
        limits.max_output_buffer = 4096;
    if (opts & 16)
        limits.max_request_bytes = 20000; /* a second stream's first 16 KiB goes over */
    srv = grpc_server_new(base, methods, nmethods, &limits);
    if (!srv)
        goto out;
    int port = 0;
    char err[256];
    if (grpc_server_listen(srv, "127.0.0.1", 0, &port, err, sizeof(err)) != 0)
        fuzz_fail(__FILE__, __LINE__, "listen: %s", err);

    c.out_len = sizeof(preface) - 1 + in_len;
    c.out = malloc(c.out_len);
    if (!c.out)
        goto out;
    memcpy(c.out, preface, sizeof(preface) - 1);
    if (in_len)
        memcpy(c.out + sizeof(preface) - 1, in, in_len);
    c.fd = connect_to(port);
    c.ev = event_new(base, c.fd, EV_READ | EV_PERSIST, client_read, &c);
    if (!c.ev || event_add(c.ev, NULL) != 0)
        fuzz_fail(__FILE__, __LINE__, "client event");

    /* Until the server has read everything and is quiet, or has closed. */
    int server_fd = -1, quiet = 0;
    for (int turn = 0; turn < 100000; turn++) {
        client_write(&c);
        event_base_loop(base, EVLOOP_NONBLOCK);
        size_t conns = grpc_server_connection_count(srv);
        if (server_fd < 0 && conns > 0)
            server_fd = find_server_fd(c.fd);
        if (c.closed || (server_fd >= 0 && conns == 0))
            break;
        if (server_fd >= 0 && c.out_off == c.out_len) {
            int avail = 0;
            if (ioctl(server_fd, FIONREAD, &avail) == 0 && avail == 0) {
                if (++quiet >= 3)
                    break;
            } else {
                quiet = 0;
            }
        }
    }

    /* Reset our end; the server must let the connection go. */
    event_free(c.ev);
    c.ev = NULL;
    struct linger lg = {1, 0};
    setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(c.fd);
    c.fd = -1;
    for (int turn = 0; turn < 1000 && grpc_server_connection_count(srv) > 0; turn++)
        event_base_loop(base, EVLOOP_NONBLOCK);
    if (checks) {
        FUZZ_CHECK(grpc_server_connection_count(srv) == 0, "connection kept after a reset");
        FUZZ_CHECK(grpc_server_request_bytes(srv) == 0, "%zu request bytes kept after the close",
                   grpc_server_request_bytes(srv));
        FUZZ_CHECK(scaler_service_stream_count(svc) == 0, "%zu streams kept after the close",
                   scaler_service_stream_count(svc));
    }

out:
    if (c.ev)
        event_free(c.ev);
    if (c.fd >= 0)
        close(c.fd);
    free(c.out);
    grpc_server_free(srv); /* cancels streams: the service forgets them */
    scaler_service_free(svc);
    scaler_state_free(st);
    event_base_free(base);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > MAX_INPUT)
        return 0;
    fuzz_run_with_oom(run, data, size);
    return 0;
}
