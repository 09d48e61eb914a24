/* fd_limit: the process's open-file limit.
 *
 * Every client, backend and admin connection is a file descriptor, and a
 * shell or systemd default soft limit of 1024 is reached long before memory
 * is. Like Go programs (KEDA's among them, since Go 1.19), both binaries
 * raise the soft limit to the hard one at start. */
#ifndef THAW_FD_LIMIT_H
#define THAW_FD_LIMIT_H

/* Raises RLIMIT_NOFILE's soft limit to its hard limit. Returns the soft
 * limit in force afterwards (the old one if raising failed), or -1 when it
 * cannot be read; RLIM_INFINITY reads as -2. */
long fd_limit_raise(void);

#endif
