/* balance: choosing an endpoint and reading endpoint lists. Pure, no I/O.
 *
 * Least outstanding requests: among healthy endpoints below the per-endpoint
 * concurrency cap, the one with the fewest requests in flight; ties go round
 * robin so equal endpoints share the load. When every healthy endpoint is at
 * its cap, nothing is picked and the request waits in the hold queue. */
#ifndef THAW_BALANCE_H
#define THAW_BALANCE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

struct balance_ep {
    unsigned outstanding;
    bool healthy;
    bool removed; /* gone from the endpoint list, finishing its requests */
};

/* Index into eps of the endpoint to use, or -1. cap 0 means no cap. *rr is
 * the round-robin cursor, advanced on each pick. */
int balance_pick(struct balance_ep *const *eps, size_t n, unsigned cap, size_t *rr);

/* How many more requests the endpoints can take now (SIZE_MAX without a cap
 * when any is healthy). */
size_t balance_capacity(struct balance_ep *const *eps, size_t n, unsigned cap);

/* This activator's part of a per-endpoint cap that peers activators share:
 * ceil(cap / peers), at least 1 (so every activator can reach every
 * endpoint; with peers > cap the endpoints may get up to peers requests).
 * peers is in thousandths (BALANCE_PEER_UNIT each), so a draining peer that
 * still uses part of its share counts for that part only. cap 0 (no cap)
 * stays 0; peers of one or less leave the whole cap. */
#define BALANCE_PEER_UNIT 1000u
unsigned balance_share(unsigned cap, unsigned peers_milli);

/* host as an IP literal (IPv6 without brackets) with port, into *ss and
 * *len. Returns 0, or -1 when host is not an IP literal (a name). */
int balance_sockaddr(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len);

struct balance_addr {
    char host[64]; /* IP literal (IPv6 without brackets) */
    int port;
};

/* Parses an endpoints file: one HOST:PORT per line ([v6]:port for IPv6,
 * "localhost" for 127.0.0.1), '#' comments and blank lines ignored, duplicates
 * dropped. *out is allocated (caller frees with thaw_free) and may be empty.
 * Returns the count, or -1 with err naming the line. */
long balance_parse_endpoints(const char *text, size_t len, struct balance_addr **out, char *err,
                             size_t errlen);

#endif
