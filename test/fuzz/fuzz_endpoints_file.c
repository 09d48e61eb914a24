/* Target endpoints_file: the activator's endpoints file (one HOST:PORT a
 * line; activator/balance.c balance_parse_endpoints), as backend.c reads it.
 *
 * Input: the file's bytes. Checks: each address is an IP literal that
 * inet_pton takes (the backend turns them into sockaddrs), ports 0..65535,
 * no duplicates; a failure names a line. Then again with an allocation failing. */
#include <arpa/inet.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "balance.h"
#include "fuzz.h"

static bool checks;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_logs();
    return 0;
}

static void run(const uint8_t *data, size_t size, bool with_checks)
{
    checks = with_checks;
    char *text = malloc(size ? size : 1);
    if (!text)
        return;
    if (size)
        memcpy(text, data, size);
    struct balance_addr *addrs = NULL;
    char err[128];
    memset(err, 'X', sizeof(err));
    long n = balance_parse_endpoints(text, size, &addrs, err, sizeof(err));
    free(text);
    if (n < 0) {
        FUZZ_CHECK(n == -1, "returned %ld", n);
        size_t elen = strnlen(err, sizeof(err));
        FUZZ_CHECK(elen > 0 && elen < sizeof(err), "failure without a reason");
        return;
    }
    FUZZ_CHECK(addrs != NULL, "%ld endpoints, no array", n);
    for (long i = 0; checks && i < n; i++) {
        const struct balance_addr *a = &addrs[i];
        FUZZ_CHECK(memchr(a->host, '\0', sizeof(a->host)) != NULL, "host not terminated");
        unsigned char buf[16];
        FUZZ_CHECK(inet_pton(AF_INET, a->host, buf) == 1 || inet_pton(AF_INET6, a->host, buf) == 1,
                   "endpoint %ld host '%s' is no IP literal", i, a->host);
        FUZZ_CHECK(a->port >= 0 && a->port <= 65535, "port %d", a->port);
        for (long k = 0; k < i; k++)
            FUZZ_CHECK(!(addrs[k].port == a->port && strcmp(addrs[k].host, a->host) == 0),
                       "duplicate %s:%d", a->host, a->port);
    }
    thaw_free(addrs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_run_with_oom(run, data, size);
    return 0;
}
