/* tcp_opts: see tcp_opts.h. */
#include "tcp_opts.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

int tcp_opts_apply(int fd)
{
    static const int one = 1, idle = TCP_OPTS_KEEPALIVE_IDLE_S,
                     interval = TCP_OPTS_KEEPALIVE_INTERVAL_S;
    int rc = 0, err = 0;
    const struct {
        int level, name;
        const int *value;
    } opts[] = {
        {IPPROTO_TCP, TCP_NODELAY, &one},
        {SOL_SOCKET, SO_KEEPALIVE, &one},
        {IPPROTO_TCP, TCP_KEEPIDLE, &idle},
        {IPPROTO_TCP, TCP_KEEPINTVL, &interval},
    };
    for (size_t i = 0; i < sizeof(opts) / sizeof(opts[0]); i++) {
        if (setsockopt(fd, opts[i].level, opts[i].name, opts[i].value, sizeof(int)) != 0 &&
            rc == 0) {
            rc = -1;
            err = errno;
        }
    }
    if (rc != 0)
        errno = err;
    return rc;
}
