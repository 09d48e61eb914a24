/* peer_proc: what the C integration tests need to run a real peer process
 * (redis-server, prometheus): a free loopback port; the child started with its
 * output in a log file and killed with us (PR_SET_PDEATHSIG) even if we are
 * SIGKILLed; stopping it within a deadline; removing its temp dir; showing its
 * log when a test fails. Also the tests' CHECK counters. */
#ifndef THAW_PEER_PROC_H
#define THAW_PEER_PROC_H

#include <stdio.h>
#include <sys/types.h>

extern int peer_checks_passed;
extern int peer_checks_failed;

/* Counts a check; on failure prints where and the printf-style reason. */
#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if (cond) {                                                                        \
            peer_checks_passed++;                                                          \
        } else {                                                                           \
            peer_checks_failed++;                                                          \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fputc('\n', stderr);                                                           \
        }                                                                                  \
    } while (0)

/* A TCP port on 127.0.0.1, free now and reserved for this process until it
 * exits (a lock file shared with the node harness's freePort()), or -1. */
int peer_free_port(void);

/* Forks and execs bin with argv (argv[0] included, NULL-terminated), stdout
 * and stderr appended to log_path. Returns the pid, or -1. */
pid_t peer_spawn(const char *log_path, const char *bin, char *const argv[]);

/* Sends sig to *pid and waits up to timeout_ms for it to exit, then SIGKILLs
 * it; *pid becomes -1. Nothing when *pid <= 0. */
void peer_stop(volatile pid_t *pid, int sig, long timeout_ms);

/* rm -rf dir, then dir[0] = '\0'. Nothing when dir is empty. */
void peer_remove_dir(char *dir);

/* Copies the file at path to stderr between marker lines, if it exists. */
void peer_dump_log(const char *path);

#endif
