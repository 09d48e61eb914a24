/* runner: main() for the fuzz targets built without libFuzzer. Runs every
 * file given, and every regular file in every directory given (sorted, dot
 * files and *.md skipped), once through LLVMFuzzerTestOneInput. A missing
 * directory is skipped (git keeps no empty regression directory); finding no
 * input at all is a failure, so a wrong path cannot pass silently. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, len = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            fprintf(stderr, "%s: out of memory\n", path);
            return -1;
        }
        size_t r = fread(buf + len, 1, cap - len, f);
        len += r;
        if (r == 0)
            break;
        if (len == cap) {
            uint8_t *nb = realloc(buf, cap * 2);
            if (!nb)
                free(buf);
            buf = nb;
            cap *= 2;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        fprintf(stderr, "%s: read error\n", path);
        return -1;
    }
    /* An exact-size copy, as libFuzzer passes it, so reading one byte past
     * the input is caught by ASan here too. */
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact) {
        free(buf);
        return -1;
    }
    if (len)
        memcpy(exact, buf, len);
    free(buf);
    fprintf(stderr, "run %s (%zu bytes)\n", path, len);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Returns the number of inputs run, or -1. */
static long run_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) {
            fprintf(stderr, "%s: absent, skipped\n", dir);
            return 0;
        }
        fprintf(stderr, "%s: %s\n", dir, strerror(errno));
        return -1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (e->d_name[0] == '.' || (l > 3 && strcmp(e->d_name + l - 3, ".md") == 0))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **nn = realloc(names, cap * sizeof(*names));
            if (!nn)
                break;
            names = nn;
        }
        names[n] = strdup(e->d_name);
        if (names[n])
            n++;
    }
    closedir(d);
    if (n)
        qsort(names, n, sizeof(*names), by_name);
    long ran = 0;
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        struct stat st;
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            if (run_file(path) < 0)
                ran = -1;
            else if (ran >= 0)
                ran++;
        }
        free(names[i]);
    }
    free(names);
    return ran;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
        return 2;
    }
    LLVMFuzzerInitialize(&argc, &argv);
    long total = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        long r;
        if (stat(argv[i], &st) == 0 && S_ISREG(st.st_mode))
            r = run_file(argv[i]) == 0 ? 1 : -1;
        else
            r = run_dir(argv[i]);
        if (r < 0)
            return 1;
        total += r;
    }
    if (total == 0) {
        fprintf(stderr, "no input found\n");
        return 1;
    }
    fprintf(stderr, "%ld inputs ran\n", total);
    return 0;
}
