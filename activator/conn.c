/* POLLRDHUP (Linux) is only declared with _GNU_SOURCE. */
#define _GNU_SOURCE

#include "conn.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "alloc.h"
#include "tcp_opts.h"

#define READ_CHUNK 16384

struct conn_flusher {
    struct event *ev;
    struct conn *head, *tail; /* connections with unwritten output */
};

struct conn {
    struct event_base *base;
    struct conn_flusher *fl;
    evutil_socket_t fd;
    struct event *rev, *wev, *tev, *pend;
    struct event *sev; /* send timeout; created the first time output waits */
    long send_ms;
    struct evbuffer *in, *out;
    conn_data_cb read_cb, write_cb;
    conn_event_cb event_cb;
    void *ud;
    size_t read_hi, write_lo;
    bool read_on;     /* the owner wants input */
    bool rev_added;
    bool wev_added;
    bool connecting;
    bool read_eof;    /* no more input will come */
    bool broken;      /* an error: no more I/O at all */
    bool dirty;       /* on the flusher's list */
    bool sev_on;      /* the send timeout is armed */
    bool dead;        /* conn_free was called */
    int in_cb;        /* callbacks running on the stack */
    int pend_what, pend_err;
    struct conn *prev_dirty, *next_dirty;
};

static void really_free(struct conn *c)
{
    if (c->rev)
        event_free(c->rev);
    if (c->wev)
        event_free(c->wev);
    if (c->tev)
        event_free(c->tev);
    if (c->pend)
        event_free(c->pend);
    if (c->sev)
        event_free(c->sev);
    if (c->in)
        evbuffer_free(c->in);
    if (c->out)
        evbuffer_free(c->out);
    thaw_free(c);
}

static void maybe_free(struct conn *c)
{
    if (c->dead && c->in_cb == 0)
        really_free(c);
}

static void unlink_dirty(struct conn *c)
{
    if (!c->dirty)
        return;
    struct conn_flusher *f = c->fl;
    if (c->prev_dirty)
        c->prev_dirty->next_dirty = c->next_dirty;
    else
        f->head = c->next_dirty;
    if (c->next_dirty)
        c->next_dirty->prev_dirty = c->prev_dirty;
    else
        f->tail = c->prev_dirty;
    c->prev_dirty = c->next_dirty = NULL;
    c->dirty = false;
}

static void update_read(struct conn *c)
{
    bool want = c->read_on && !c->connecting && !c->read_eof && !c->broken && !c->dead &&
                (c->read_hi == 0 || evbuffer_get_length(c->in) < c->read_hi);
    if (want && !c->rev_added) {
        if (event_add(c->rev, NULL) == 0)
            c->rev_added = true;
    } else if (!want && c->rev_added) {
        event_del(c->rev);
        c->rev_added = false;
    }
}

static void update_write(struct conn *c)
{
    bool want = !c->dead && !c->broken && (c->connecting || evbuffer_get_length(c->out) > 0);
    if (want && !c->wev_added) {
        if (event_add(c->wev, NULL) == 0)
            c->wev_added = true;
    } else if (!want && c->wev_added) {
        event_del(c->wev);
        c->wev_added = false;
    }
}

static void fire_event(struct conn *c, int what, int err)
{
    if (!c->event_cb || c->dead)
        return;
    c->in_cb++;
    c->event_cb(c, what, err, c->ud);
    c->in_cb--;
}

static void on_send_timeout(evutil_socket_t fd, short what, void *arg);

static void send_timer_off(struct conn *c)
{
    if (c->sev_on) {
        evtimer_del(c->sev);
        c->sev_on = false;
    }
}

/* After a write attempt: output left means the peer is not keeping up. The
 * period restarts on progress only, so a stuck peer is timed from its last
 * byte taken, whatever is added to the output meanwhile. */
static void send_timer_update(struct conn *c, bool progress)
{
    if (c->send_ms <= 0 || evbuffer_get_length(c->out) == 0) {
        send_timer_off(c);
        return;
    }
    if (c->sev_on && !progress)
        return;
    /* Made only now: most connections never wait on their peer. Without
     * memory there is no send timeout this time; the next write tries again. */
    if (!c->sev && !(c->sev = evtimer_new(c->base, on_send_timeout, c)))
        return;
    struct timeval tv = {c->send_ms / 1000, (c->send_ms % 1000) * 1000};
    if (evtimer_add(c->sev, &tv) == 0)
        c->sev_on = true;
}

static void fail(struct conn *c, int err)
{
    c->broken = true;
    unlink_dirty(c);
    update_read(c);
    update_write(c);
    send_timer_off(c);
    fire_event(c, CONN_ERROR, err);
}

/* Writes as much output as the socket takes now. */
static void do_write(struct conn *c)
{
    if (c->dead || c->connecting || c->broken)
        return;
    size_t before = evbuffer_get_length(c->out);
    while (evbuffer_get_length(c->out) > 0) {
        int n = evbuffer_write(c->out, c->fd);
        if (n < 0) {
            int e = errno;
            if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR)
                break;
            fail(c, e);
            return;
        }
        if (n == 0)
            break;
    }
    update_write(c);
    size_t after = evbuffer_get_length(c->out);
    if (c->send_ms > 0)
        send_timer_update(c, after < before);
    if (after < before && after <= c->write_lo && c->write_cb && !c->dead) {
        c->in_cb++;
        c->write_cb(c, c->ud);
        c->in_cb--;
    }
}

static void flusher_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct conn_flusher *f = arg;
    struct conn *c;
    /* Callbacks may queue more connections; the loop takes them too. */
    while ((c = f->head)) {
        unlink_dirty(c);
        c->in_cb++;
        do_write(c);
        c->in_cb--;
        maybe_free(c);
    }
}

static void out_changed(struct evbuffer *b, const struct evbuffer_cb_info *info, void *arg)
{
    (void)b;
    struct conn *c = arg;
    if (info->n_added == 0 || c->dirty || c->dead || c->connecting || c->broken)
        return;
    struct conn_flusher *f = c->fl;
    c->dirty = true;
    c->next_dirty = NULL;
    c->prev_dirty = f->tail;
    if (f->tail)
        f->tail->next_dirty = c;
    else
        f->head = c;
    f->tail = c;
    event_active(f->ev, EV_WRITE, 1);
}

static void in_changed(struct evbuffer *b, const struct evbuffer_cb_info *info, void *arg)
{
    (void)b;
    struct conn *c = arg;
    if (info->n_deleted > 0 && !c->dead)
        update_read(c); /* below the high watermark again: resume */
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct conn *c = arg;
    if (c->dead || c->read_eof || c->broken)
        return;
    size_t want = READ_CHUNK;
    if (c->read_hi) {
        size_t have = evbuffer_get_length(c->in);
        if (have >= c->read_hi) {
            update_read(c);
            return;
        }
        if (c->read_hi - have < want)
            want = c->read_hi - have;
    }
    struct evbuffer_iovec v[2];
    int nv = evbuffer_reserve_space(c->in, (ev_ssize_t)want, v, 2);
    if (nv <= 0) {
        c->in_cb++;
        fail(c, ENOMEM);
        c->in_cb--;
        maybe_free(c);
        return;
    }
    struct iovec iov[2];
    size_t total = 0;
    for (int i = 0; i < nv; i++) {
        size_t l = v[i].iov_len;
        if (l > want - total)
            l = want - total;
        iov[i].iov_base = v[i].iov_base;
        iov[i].iov_len = l;
        total += l;
    }
    ssize_t r = readv(fd, iov, nv);
    if (r < 0) {
        int e = errno;
        evbuffer_commit_space(c->in, v, 0);
        if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR)
            return;
        c->in_cb++;
        fail(c, e);
        c->in_cb--;
        maybe_free(c);
        return;
    }
    if (r == 0) {
        evbuffer_commit_space(c->in, v, 0);
        c->read_eof = true;
        update_read(c);
        c->in_cb++;
        fire_event(c, CONN_EOF, 0);
        c->in_cb--;
        maybe_free(c);
        return;
    }
    size_t left = (size_t)r;
    int used = 0;
    for (int i = 0; i < nv && left > 0; i++) {
        v[i].iov_len = iov[i].iov_len < left ? iov[i].iov_len : left;
        left -= v[i].iov_len;
        used++;
    }
    evbuffer_commit_space(c->in, v, used);
    update_read(c);
    if (c->read_cb) {
        c->in_cb++;
        c->read_cb(c, c->ud);
        c->in_cb--;
    }
    maybe_free(c);
}

static void on_writable(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct conn *c = arg;
    if (c->dead)
        return;
    c->in_cb++;
    if (c->connecting) {
        int err = 0;
        socklen_t len = sizeof(err);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
            err = errno;
        if (err == EINPROGRESS) {
            c->in_cb--;
            return;
        }
        c->connecting = false;
        if (err) {
            fail(c, err);
        } else {
            update_write(c);
            update_read(c);
            fire_event(c, CONN_CONNECTED, 0);
            do_write(c); /* what was queued while connecting */
        }
    } else {
        do_write(c);
    }
    c->in_cb--;
    maybe_free(c);
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct conn *c = arg;
    c->in_cb++;
    fire_event(c, CONN_TIMEOUT, ETIMEDOUT);
    c->in_cb--;
    maybe_free(c);
}

static void on_send_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct conn *c = arg;
    c->sev_on = false;
    c->in_cb++;
    fire_event(c, CONN_SEND_TIMEOUT, ETIMEDOUT);
    c->in_cb--;
    maybe_free(c);
}

static void on_pending(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct conn *c = arg;
    c->in_cb++;
    if (c->pend_what == CONN_CONNECTED) {
        update_read(c);
        fire_event(c, CONN_CONNECTED, 0);
    } else {
        fire_event(c, c->pend_what, c->pend_err);
    }
    c->in_cb--;
    maybe_free(c);
}

struct conn_flusher *conn_flusher_new(struct event_base *base)
{
    struct conn_flusher *f = thaw_calloc(1, sizeof(*f));
    if (!f)
        return NULL;
    f->ev = event_new(base, -1, 0, flusher_cb, f);
    if (!f->ev) {
        thaw_free(f);
        return NULL;
    }
    return f;
}

void conn_flusher_free(struct conn_flusher *f)
{
    if (!f)
        return;
    event_free(f->ev);
    thaw_free(f);
}

static struct conn *conn_alloc(struct event_base *base, struct conn_flusher *f,
                               evutil_socket_t fd)
{
    struct conn *c = thaw_calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->base = base;
    c->fl = f;
    c->fd = fd;
    c->in = evbuffer_new();
    c->out = evbuffer_new();
    c->rev = event_new(base, fd, EV_READ | EV_PERSIST, on_readable, c);
    c->wev = event_new(base, fd, EV_WRITE | EV_PERSIST, on_writable, c);
    if (!c->in || !c->out || !c->rev || !c->wev || !evbuffer_add_cb(c->out, out_changed, c) ||
        !evbuffer_add_cb(c->in, in_changed, c)) {
        really_free(c);
        return NULL;
    }
    return c;
}

struct conn *conn_new_fd(struct event_base *base, struct conn_flusher *f, evutil_socket_t fd)
{
    if (evutil_make_socket_nonblocking(fd) < 0)
        return NULL;
    (void)tcp_opts_apply(fd);
    return conn_alloc(base, f, fd);
}

static void schedule(struct conn *c, int what, int err)
{
    c->pend_what = what;
    c->pend_err = err;
    event_active(c->pend, EV_TIMEOUT, 1);
}

struct conn *conn_connect(struct event_base *base, struct conn_flusher *f,
                          const struct sockaddr *sa, socklen_t len)
{
    evutil_socket_t fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return NULL;
    (void)tcp_opts_apply(fd);
    struct conn *c = conn_alloc(base, f, fd);
    if (!c) {
        close(fd);
        return NULL;
    }
    c->pend = event_new(base, -1, 0, on_pending, c);
    if (!c->pend) {
        conn_free(c);
        return NULL;
    }
    if (connect(fd, sa, len) == 0) {
        schedule(c, CONN_CONNECTED, 0);
    } else if (errno == EINPROGRESS) {
        c->connecting = true;
        update_write(c);
    } else {
        /* Refused at once (common on loopback): reported from the loop, like
         * any other refusal, and nothing is ever written. */
        c->broken = true;
        schedule(c, CONN_ERROR, errno);
    }
    return c;
}

void conn_free(struct conn *c)
{
    if (!c || c->dead)
        return;
    c->dead = true;
    unlink_dirty(c);
    event_del(c->rev);
    event_del(c->wev);
    if (c->tev)
        event_del(c->tev);
    if (c->pend)
        event_del(c->pend);
    send_timer_off(c);
    evbuffer_remove_cb(c->out, out_changed, c);
    evbuffer_remove_cb(c->in, in_changed, c);
    close(c->fd);
    c->fd = -1;
    maybe_free(c);
}

void conn_setcb(struct conn *c, conn_data_cb read_cb, conn_data_cb write_cb,
                conn_event_cb event_cb, void *ud)
{
    c->read_cb = read_cb;
    c->write_cb = write_cb;
    c->event_cb = event_cb;
    c->ud = ud;
}

struct evbuffer *conn_input(struct conn *c) { return c->in; }
struct evbuffer *conn_output(struct conn *c) { return c->out; }
evutil_socket_t conn_fd(const struct conn *c) { return c->fd; }

void conn_set_read_high(struct conn *c, size_t hi)
{
    c->read_hi = hi;
    update_read(c);
}

void conn_set_write_low(struct conn *c, size_t lo) { c->write_lo = lo; }

void conn_enable_read(struct conn *c)
{
    c->read_on = true;
    update_read(c);
}

void conn_disable_read(struct conn *c)
{
    c->read_on = false;
    update_read(c);
}

void conn_set_timeout(struct conn *c, long ms)
{
    if (ms <= 0) {
        if (c->tev)
            evtimer_del(c->tev);
        return;
    }
    if (!c->tev && !(c->tev = evtimer_new(c->base, on_timeout, c)))
        return;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(c->tev, &tv);
}

void conn_set_send_timeout(struct conn *c, long ms)
{
    c->send_ms = ms > 0 ? ms : 0;
    send_timer_off(c);
    if (c->send_ms > 0)
        send_timer_update(c, true);
}

bool conn_read_full(const struct conn *c)
{
    return c->read_hi > 0 && evbuffer_get_length(c->in) >= c->read_hi;
}

bool conn_peer_closed(const struct conn *c)
{
    if (c->read_eof || c->broken)
        return true;
    if (c->dead || c->connecting)
        return false;
    /* POLLRDHUP reports the peer's FIN even behind unread bytes, which a
     * read could only reach after consuming them. */
    struct pollfd p = {.fd = c->fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0)
        return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

long conn_unacked(const struct conn *c)
{
    if (c->dead || c->fd < 0)
        return -1;
    int q = 0;
    if (ioctl(c->fd, SIOCOUTQ, &q) < 0 || q < 0)
        return -1;
    return (long)evbuffer_get_length(c->out) + q;
}
