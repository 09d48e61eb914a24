#include "model_name.h"

#include "utf8.h"

bool model_name_valid(const char *s, size_t len)
{
    if (len == 0 || len > MODEL_NAME_MAX)
        return false;
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        size_t l = utf8_seq_len(p + i, len - i);
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
