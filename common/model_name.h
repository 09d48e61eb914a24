/* model_name: the one rule for a model name both binaries accept where a
 * name crosses between them (the activator's config, which names what it
 * wakes, and thaw-scaler's POST /wake), so a model the activator serves can
 * always be woken over HTTP.
 *
 * A name is 1-512 bytes of UTF-8 without control characters (C0, DEL, C1)
 * and without NUL; spaces and any other printable character are allowed,
 * as in ScaledObject metadata. Pure. */
#ifndef THAW_MODEL_NAME_H
#define THAW_MODEL_NAME_H

#include <stdbool.h>
#include <stddef.h>

#define MODEL_NAME_MAX 512

bool model_name_valid(const char *s, size_t len);

/* Percent-decodes a query value (RFC 3986; '+' is a space, as in forms) into
 * out (outlen >= MODEL_NAME_MAX + 1) and checks it with model_name_valid.
 * Returns the name's length, or -1 (bad escape, too long, or invalid). */
long model_name_from_query(const char *raw, size_t rawlen, char *out, size_t outlen);

#endif
