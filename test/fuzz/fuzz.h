/* fuzz: shared pieces of the libFuzzer targets in this directory.
 *
 * Each fuzz_<target>.c defines LLVMFuzzerInitialize and LLVMFuzzerTestOneInput.
 * Built two ways (test/fuzz/meson.build):
 *   - with -Dfuzz=true under clang: linked with libFuzzer (-fsanitize=fuzzer);
 *   - always: linked with runner.c, a main() that runs every file of the given
 *     corpus and regression directories once (the `unit` suite does this).
 * A broken invariant is reported by FUZZ_CHECK, which aborts: harness code may
 * abort, product code never does. */
#ifndef THAW_FUZZ_H
#define THAW_FUZZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Prints where and why, then aborts (a crash for libFuzzer, a failure for the runner). */
void fuzz_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));
/* The same for FUZZ_CHECK: cond is the failed expression's text. */
void fuzz_check_failed(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5), noreturn));
#define FUZZ_CHECK(cond, ...)                                                                  \
    do {                                                                                       \
        if (!(cond))                                                                           \
            fuzz_check_failed(__FILE__, __LINE__, #cond, __VA_ARGS__);                         \
    } while (0)

/* Logs are formatted (at debug level, so every log line's formatting of
 * hostile text runs) and thrown away: the fuzzer's output stays readable.
 * THAW_FUZZ_LOGS=1 in the environment keeps them on stderr. */
void fuzz_quiet_logs(void);

/* Small deterministic PRNG for split points, seeded from input bytes. */
struct fuzz_rng {
    uint64_t s;
};
void fuzz_rng_seed(struct fuzz_rng *r, const uint8_t *data, size_t len);
uint32_t fuzz_rng_next(struct fuzz_rng *r);
/* A chunk length in 1..max, biased to small values (1 byte splits matter most). */
size_t fuzz_rng_chunk(struct fuzz_rng *r, size_t max);

/* Allocation-failure injection (common/alloc.h): after a run with checks, the
 * targets run the same input again with the k-th thaw_* allocation from now
 * failing, k derived from the input, so out-of-memory paths get fuzzed too
 * (LeakSanitizer then checks that they free what they took). */
long fuzz_oom_point(const uint8_t *data, size_t len);

/* The two passes of a target: run(data, len, true) with its result checks on,
 * then run(data, len, false) with the fuzz_oom_point() allocation failing
 * (results may differ then; only safety and leaks are checked). */
void fuzz_run_with_oom(void (*run)(const uint8_t *, size_t, bool), const uint8_t *data,
                       size_t len);

/* Keeps jansson on plain malloc, out of reach of the injection above:
 * jansson 2.14's lexer ignores a failed buffer append and then trips its own
 * assert (load.c lex_unget_unsave: `c == d`) when an allocation fails while it
 * lexes, which would end every run at once. (thaw-activator routes jansson
 * through thaw_malloc, so a real out-of-memory while loading the config
 * aborts there; reported, not a fuzzing target.) */
void fuzz_jansson_no_oom(void);

/* A NUL-terminated copy (plain malloc, never failing under injection; NULL
 * only if the process is out of memory, which the caller treats as "skip"). */
char *fuzz_strndup(const uint8_t *data, size_t len);

#endif
