/* utf8: strict UTF-8 (RFC 3629): overlong forms, surrogates and code points
 * past U+10FFFF are not UTF-8. Text that ends up in a Prometheus label, a
 * JSON document or a proto3 string field must be, or the whole scrape, the
 * page or the peer's decoding fails. Pure. */
#ifndef THAW_UTF8_H
#define THAW_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/* Length of the UTF-8 sequence at p (n >= 1 bytes available), 0 if none. */
size_t utf8_seq_len(const unsigned char *p, size_t n);

/* True if the len bytes at s are UTF-8 (NUL bytes included: they are U+0000). */
bool utf8_valid(const char *s, size_t len);

#endif
