/* conn: a non-blocking TCP connection with input and output evbuffers, for
 * the proxy's hot path. Like a libevent bufferevent, but cheaper per request:
 *
 * - the read event stays registered (persistent) instead of being re-armed;
 * - reads go straight into reserved evbuffer space (no FIONREAD ioctl);
 * - output is written at once, from one "flusher" event activated at the end
 *   of the current callbacks, so a write costs one writev; a write event is
 *   registered only when the socket would block.
 * That is about four syscalls per proxied request instead of ten.
 *
 * Callbacks: read (new input), write (output drained to the low watermark
 * after having held more), event (CONN_CONNECTED, CONN_EOF, CONN_ERROR,
 * CONN_TIMEOUT, CONN_SEND_TIMEOUT). None is called from inside a conn_*
 * function; conn_free may be called from any callback (the memory goes once
 * the callback returns). */
#ifndef THAW_CONN_H
#define THAW_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#include <event2/util.h>

struct event_base;
struct evbuffer;
struct conn;
struct conn_flusher;

enum {
    CONN_CONNECTED = 1 << 0,
    CONN_EOF = 1 << 1,
    CONN_ERROR = 1 << 2,
    CONN_TIMEOUT = 1 << 3,
    CONN_SEND_TIMEOUT = 1 << 4, /* output waited, the peer took none of it */
};

typedef void (*conn_data_cb)(struct conn *c, void *ud);
typedef void (*conn_event_cb)(struct conn *c, int what, int err, void *ud);

/* One flusher per event base, shared by its connections. */
struct conn_flusher *conn_flusher_new(struct event_base *base);
/* Only once every conn using it is freed. Accepts NULL. */
void conn_flusher_free(struct conn_flusher *f);

/* Wraps an accepted, connected socket (made non-blocking; closed on free). */
struct conn *conn_new_fd(struct event_base *base, struct conn_flusher *f, evutil_socket_t fd);
/* Starts a non-blocking connect; CONN_CONNECTED or CONN_ERROR follows via
 * the event callback. Output written before that is sent once connected.
 * Returns NULL on local failure (no socket, no memory). */
struct conn *conn_connect(struct event_base *base, struct conn_flusher *f,
                          const struct sockaddr *sa, socklen_t len);
/* Closes the socket. Safe inside callbacks. Accepts NULL. */
void conn_free(struct conn *c);

void conn_setcb(struct conn *c, conn_data_cb read_cb, conn_data_cb write_cb,
                conn_event_cb event_cb, void *ud);
struct evbuffer *conn_input(struct conn *c);
struct evbuffer *conn_output(struct conn *c);
evutil_socket_t conn_fd(const struct conn *c);

/* Reading stops while the input holds hi bytes or more (0: no bound). */
void conn_set_read_high(struct conn *c, size_t hi);
/* The write callback fires when a write brings the output to lo or below. */
void conn_set_write_low(struct conn *c, size_t lo);
void conn_enable_read(struct conn *c);
void conn_disable_read(struct conn *c);
/* One timer: CONN_TIMEOUT after ms (<= 0 cancels). */
void conn_set_timeout(struct conn *c, long ms);
/* Send timeout, like nginx's send_timeout: CONN_SEND_TIMEOUT once output has
 * been waiting ms without the socket taking a byte of it. Measured between
 * two writes that make progress, not over the whole output, so a slow reader
 * that keeps reading is fine. Independent of conn_set_timeout's timer.
 * 0 (the default) turns it off. */
void conn_set_send_timeout(struct conn *c, long ms);

/* True while reading is stopped because the input holds the high watermark
 * (no read event then, so no CONN_EOF either). */
bool conn_read_full(const struct conn *c);
/* Whether the peer has closed (FIN, even behind unread bytes) or reset the
 * connection, asked of the socket now with one poll(); no callback fires.
 * For connections whose reading is stopped. */
bool conn_peer_closed(const struct conn *c);
/* Bytes written to c that the peer's TCP has not acknowledged: those still
 * in the output plus those sent and unacknowledged (SIOCOUTQ, which keeps
 * its count after a reset). 0 means the peer's kernel took every byte; -1
 * if the socket cannot tell. Valid until conn_free, EOF and errors included. */
long conn_unacked(const struct conn *c);

#endif
