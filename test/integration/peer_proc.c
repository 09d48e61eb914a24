#include "peer_proc.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clock.h"

int peer_checks_passed;
int peer_checks_failed;

int peer_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    int port = -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    close(fd);
    return port;
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
