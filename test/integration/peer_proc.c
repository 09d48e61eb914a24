#include "peer_proc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clock.h"

int peer_checks_passed;
int peer_checks_failed;

/* Ports come from below the kernel's ephemeral range, reserved with a lock
 * file per port shared with the node harness (freePort() in
 * test/integration/lib/harness.mjs): no other test process running at the
 * same time (the ASan suite beside the normal one) gets the port, and no
 * outgoing connection takes it before the peer binds it, or binds it again
 * after a restart. The lock holds the owner's pid; one whose owner is gone is
 * taken over. */
#define PORT_LOCKS_MAX 32
static char port_locks[PORT_LOCKS_MAX][300];
static int port_locks_n;

static void remove_port_locks(void)
{
    for (int i = 0; i < port_locks_n; i++)
        unlink(port_locks[i]);
}

static int ephemeral_range_start(void)
{
    int lo = 32768;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        int v;
        if (fscanf(f, "%d", &v) == 1 && v > 4096)
            lo = v;
        fclose(f);
    }
    return lo;
}

static bool owner_alive(const char *path)
{
    char buf[32] = {0};
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    long pid = n > 0 ? strtol(buf, NULL, 10) : 0;
    /* An empty file is a lock being written right now: treat it as held. */
    if (n <= 0)
        return true;
    return pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM);
}

static bool lock_port(const char *dir, int port)
{
    if (port_locks_n >= PORT_LOCKS_MAX)
        return false;
    char path[sizeof(port_locks[0])];
    if (snprintf(path, sizeof(path), "%s/%d", dir, port) >= (int)sizeof(path))
        return false;
    for (int attempt = 0; attempt < 2; attempt++) {
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd >= 0) {
            char pid[32];
            int len = snprintf(pid, sizeof(pid), "%ld", (long)getpid());
            bool ok = write(fd, pid, (size_t)len) == len;
            close(fd);
            if (!ok) {
                unlink(path);
                return false;
            }
            if (port_locks_n == 0)
                atexit(remove_port_locks);
            memcpy(port_locks[port_locks_n++], path, sizeof(path));
            return true;
        }
        if (errno != EEXIST || owner_alive(path))
            return false;
        unlink(path); /* its owner is gone; another process may clear it first */
    }
    return false;
}

static bool can_bind(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return false;
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bool ok = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    close(fd);
    return ok;
}

int peer_free_port(void)
{
    const char *tmp = getenv("TMPDIR");
    char dir[256];
    if (snprintf(dir, sizeof(dir), "%s/thaw-test-ports", tmp && *tmp ? tmp : "/tmp") >=
        (int)sizeof(dir))
        return -1;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return -1;
    int hi = ephemeral_range_start();
    int lo = hi - 12000 > 1024 ? hi - 12000 : 1024;
    unsigned seed = (unsigned)getpid() ^ (unsigned)clock_mono_us();
    for (int attempt = 0; attempt < 200; attempt++) {
        int port = lo + (int)(rand_r(&seed) % (unsigned)(hi - lo));
        if (lock_port(dir, port) && can_bind(port))
            return port;
    }
    return -1;
}

pid_t peer_spawn(const char *log_path, const char *bin, char *const argv[])
{
    pid_t pid = fork();
    if (pid != 0)
        return pid < 0 ? -1 : pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
    }
    execv(bin, argv);
    _exit(127);
}

void peer_stop(volatile pid_t *pid, int sig, long timeout_ms)
{
    pid_t p = *pid;
    if (p <= 0)
        return;
    kill(p, sig);
    int64_t deadline = clock_mono_ms() + timeout_ms;
    while (clock_mono_ms() < deadline) {
        if (waitpid(p, NULL, WNOHANG) == p) {
            *pid = -1;
            return;
        }
        usleep(10000);
    }
    kill(p, SIGKILL);
    waitpid(p, NULL, 0);
    *pid = -1;
}

void peer_remove_dir(char *dir)
{
    if (!dir[0])
        return;
    pid_t pid = fork();
    if (pid == 0) {
        execlp("rm", "rm", "-rf", dir, (char *)NULL);
        _exit(127);
    }
    if (pid > 0)
        waitpid(pid, NULL, 0);
    dir[0] = '\0';
}

void peer_dump_log(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char line[1024];
    fprintf(stderr, "---- %s ----\n", path);
    while (fgets(line, sizeof(line), f))
        fputs(line, stderr);
    fprintf(stderr, "---- end ----\n");
    fclose(f);
}
