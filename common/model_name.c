#include "model_name.h"

#include <stdint.h>

/* Length of the UTF-8 sequence at p (of n bytes), 0 if it is not one:
 * overlong forms, surrogates and code points past U+10FFFF are refused. */
static size_t utf8_len(const unsigned char *p, size_t n)
{
    if (p[0] < 0x80)
        return 1;
    size_t len;
    uint32_t cp, min;
    if ((p[0] & 0xe0) == 0xc0) {
        len = 2, cp = p[0] & 0x1f, min = 0x80;
    } else if ((p[0] & 0xf0) == 0xe0) {
        len = 3, cp = p[0] & 0x0f, min = 0x800;
    } else if ((p[0] & 0xf8) == 0xf0) {
        len = 4, cp = p[0] & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

bool model_name_valid(const char *s, size_t len)
{
    if (len == 0 || len > MODEL_NAME_MAX)
        return false;
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        size_t l = utf8_len(p + i, len - i);
        if (l == 0)
            return false;
        if (l == 1 && (p[i] < 0x20 || p[i] == 0x7f))
            return false;
        /* C1 controls, U+0080..U+009F, encoded as C2 80..C2 9F. */
        if (l == 2 && p[i] == 0xc2 && p[i + 1] < 0xa0)
            return false;
        i += l;
    }
    return true;
}

static int hex(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

long model_name_from_query(const char *raw, size_t rawlen, char *out, size_t outlen)
{
    size_t o = 0;
    for (size_t i = 0; i < rawlen; i++) {
        unsigned char c = (unsigned char)raw[i];
        if (c == '%') {
            if (i + 2 >= rawlen)
                return -1; /* "%" or "%x" at the end */
            int h = hex((unsigned char)raw[i + 1]), l = hex((unsigned char)raw[i + 2]);
            if (h < 0 || l < 0)
                return -1;
            c = (unsigned char)(h * 16 + l);
            i += 2;
        } else if (c == '+') {
            c = ' ';
        }
        if (o + 1 >= outlen)
            return -1;
        out[o++] = (char)c;
    }
    out[o] = '\0';
    return model_name_valid(out, o) ? (long)o : -1;
}
