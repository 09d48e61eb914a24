#include "balance.h"

#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

static bool usable(const struct balance_ep *e, unsigned cap)
{
    return e->healthy && !e->removed && (cap == 0 || e->outstanding < cap);
}

int balance_pick(struct balance_ep *const *eps, size_t n, unsigned cap, size_t *rr)
{
    if (n == 0)
        return -1;
    int best = -1;
    size_t start = *rr % n;
    for (size_t k = 0; k < n; k++) {
        size_t i = (start + k) % n;
        if (!usable(eps[i], cap))
            continue;
        if (best < 0 || eps[i]->outstanding < eps[best]->outstanding)
            best = (int)i;
    }
    if (best >= 0)
        *rr = (size_t)best + 1;
    return best;
}

size_t balance_capacity(struct balance_ep *const *eps, size_t n, unsigned cap)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!usable(eps[i], cap))
            continue;
        if (cap == 0)
            return SIZE_MAX;
        total += cap - eps[i]->outstanding;
    }
    return total;
}

unsigned balance_share(unsigned cap, unsigned peers_milli)
{
    if (cap == 0 || peers_milli <= BALANCE_PEER_UNIT)
        return cap;
    uint64_t scaled = (uint64_t)cap * BALANCE_PEER_UNIT;
    return (unsigned)(scaled / peers_milli + (scaled % peers_milli != 0));
}

int balance_sockaddr(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len)
{
    memset(ss, 0, sizeof(*ss));
    struct sockaddr_in *s4 = (struct sockaddr_in *)(void *)ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)(void *)ss;
    if (inet_pton(AF_INET, host, &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)port);
        *len = sizeof(*s4);
        return 0;
    }
    if (inet_pton(AF_INET6, host, &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)port);
        *len = sizeof(*s6);
        return 0;
    }
    return -1;
}

static int parse_line(const char *p, size_t len, struct balance_addr *a)
{
    const char *colon;
    const char *host = p;
    size_t hl;
    if (len > 0 && p[0] == '[') {
        const char *rb = memchr(p, ']', len);
        if (!rb || (size_t)(rb - p) + 1 >= len || rb[1] != ':')
            return -1;
        host = p + 1;
        hl = (size_t)(rb - host);
        colon = rb + 1;
    } else {
        colon = NULL;
        for (size_t i = len; i > 0; i--) {
            if (p[i - 1] == ':') {
                colon = p + i - 1;
                break;
            }
        }
        if (!colon)
            return -1;
        hl = (size_t)(colon - p);
    }
    if (hl == 0 || hl >= sizeof(a->host))
        return -1;
    memcpy(a->host, host, hl);
    a->host[hl] = '\0';
    if (strcmp(a->host, "localhost") == 0)
        snprintf(a->host, sizeof(a->host), "127.0.0.1");
    struct sockaddr_storage ss;
    socklen_t sslen;
    if (balance_sockaddr(a->host, 0, &ss, &sslen) < 0)
        return -1;
    const char *ps = colon + 1, *pe = p + len;
    if (ps == pe || pe - ps > 5)
        return -1;
    long port = 0;
    for (const char *q = ps; q < pe; q++) {
        if (*q < '0' || *q > '9')
            return -1;
        port = port * 10 + (*q - '0');
    }
    if (port < 1 || port > 65535)
        return -1;
    a->port = (int)port;
    return 0;
}

long balance_parse_endpoints(const char *text, size_t len, struct balance_addr **out, char *err,
                             size_t errlen)
{
    size_t cap = 8, n = 0;
    struct balance_addr *v = thaw_malloc(cap * sizeof(*v));
    if (!v) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    size_t i = 0, lineno = 0;
    while (i < len) {
        size_t start = i;
        while (i < len && text[i] != '\n')
            i++;
        lineno++;
        size_t a = start, b = i;
        i++;
        const char *hash = memchr(text + a, '#', b - a);
        if (hash)
            b = (size_t)(hash - text);
        while (a < b && (text[a] == ' ' || text[a] == '\t' || text[a] == '\r'))
            a++;
        while (b > a && (text[b - 1] == ' ' || text[b - 1] == '\t' || text[b - 1] == '\r'))
            b--;
        if (a == b)
            continue;
        struct balance_addr addr;
        if (parse_line(text + a, b - a, &addr) < 0) {
            snprintf(err, errlen, "line %zu: expected IP:PORT", lineno);
            thaw_free(v);
            return -1;
        }
        bool dup = false;
        for (size_t k = 0; k < n && !dup; k++)
            dup = v[k].port == addr.port && strcmp(v[k].host, addr.host) == 0;
        if (dup)
            continue;
        if (n == cap) {
            struct balance_addr *nv = thaw_realloc(v, cap * 2 * sizeof(*v));
            if (!nv) {
                snprintf(err, errlen, "out of memory");
                thaw_free(v);
                return -1;
            }
            v = nv;
            cap *= 2;
        }
        v[n++] = addr;
    }
    *out = v;
    return (long)n;
}
