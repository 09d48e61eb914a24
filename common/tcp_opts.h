/* tcp_opts: the socket options of Thaw's long-lived TCP connections (gRPC
 * peers, proxied clients, pooled backend connections).
 *
 * - TCP_NODELAY: gRPC frames and streamed tokens are small and must leave
 *   at once, not wait for an acknowledgement (Nagle).
 * - Keepalive probes after 15 s without traffic, every 15 s, as Go's net
 *   package sets on every connection it dials or accepts (so KEDA's and
 *   Knative's do): a peer that vanished without a FIN or a reset (its node
 *   lost power, a partition) is found after about 150 s (Linux's default
 *   9 unanswered probes), not after the 2 h Linux waits by default (on
 *   sockets accepted from libevent's listeners, which turn keepalive on)
 *   or never (a dialled connection, which does not).
 *
 * Best effort: a socket that refuses an option works without it. */
#ifndef THAW_TCP_OPTS_H
#define THAW_TCP_OPTS_H

#define TCP_OPTS_KEEPALIVE_IDLE_S 15
#define TCP_OPTS_KEEPALIVE_INTERVAL_S 15

/* Sets the options on a TCP socket. Returns 0, or -1 (errno set) when one
 * could not be set; the others are set regardless. */
int tcp_opts_apply(int fd);

#endif
