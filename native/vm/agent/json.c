#include "json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct parser {
  const char *s, *end;
  int depth;
};

static void ws(struct parser *p) {
  while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r')) p->s++;
}

static struct jval *mk(enum jtype t) {
  struct jval *v = calloc(1, sizeof *v);
  if (v) v->type = t;
  return v;
}

static int hex4(const char *s, unsigned *out) {
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char c = s[i];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
    else return -1;
  }
  *out = v;
  return 0;
}

static void put_utf8(struct buf *b, unsigned cp) {
  char t[4];
  if (cp < 0x80) { t[0] = (char)cp; bput(b, t, 1); }
  else if (cp < 0x800) { t[0] = (char)(0xC0 | (cp >> 6)); t[1] = (char)(0x80 | (cp & 0x3F)); bput(b, t, 2); }
  else if (cp < 0x10000) {
    t[0] = (char)(0xE0 | (cp >> 12)); t[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); t[2] = (char)(0x80 | (cp & 0x3F));
    bput(b, t, 3);
  } else {
    t[0] = (char)(0xF0 | (cp >> 18)); t[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    t[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); t[3] = (char)(0x80 | (cp & 0x3F));
    bput(b, t, 4);
  }
}

static char *pstring(struct parser *p, size_t *len) {
  struct buf b = {0};
  p->s++; /* opening quote */
  while (p->s < p->end && *p->s != '"') {
    unsigned char c = (unsigned char)*p->s;
    if (c < 0x20) goto bad;
    if (c != '\\') { bput(&b, p->s, 1); p->s++; continue; }
    p->s++;
    if (p->s >= p->end) goto bad;
    char e = *p->s++;
    switch (e) {
      case '"': bput(&b, "\"", 1); break;
      case '\\': bput(&b, "\\", 1); break;
      case '/': bput(&b, "/", 1); break;
      case 'b': bput(&b, "\b", 1); break;
      case 'f': bput(&b, "\f", 1); break;
      case 'n': bput(&b, "\n", 1); break;
      case 'r': bput(&b, "\r", 1); break;
      case 't': bput(&b, "\t", 1); break;
      case 'u': {
        unsigned cp;
        if (p->end - p->s < 4 || hex4(p->s, &cp)) goto bad;
        p->s += 4;
        if (cp >= 0xD800 && cp < 0xDC00 && p->end - p->s >= 6 && p->s[0] == '\\' && p->s[1] == 'u') {
          unsigned lo;
          if (hex4(p->s + 2, &lo) == 0 && lo >= 0xDC00 && lo < 0xE000) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            p->s += 6;
          }
        }
        if (cp == 0) goto bad; /* no embedded NULs in paths or argv */
        put_utf8(&b, cp);
        break;
      }
      default: goto bad;
    }
  }
  if (p->s >= p->end) goto bad;
  p->s++;
  bput(&b, "", 0);
  if (!b.p) { b.p = malloc(1); if (!b.p) return NULL; }
  b.p[b.len] = 0;
  *len = b.len;
  return b.p;
bad:
  bfree(&b);
  return NULL;
}

static struct jval *pvalue(struct parser *p);

static struct jval *pcontainer(struct parser *p, int obj) {
  struct jval *v = mk(obj ? J_OBJ : J_ARR);
  size_t cap = 0;
  if (!v) return NULL;
  if (++p->depth > 64) goto bad;
  p->s++;
  ws(p);
  if (p->s < p->end && *p->s == (obj ? '}' : ']')) { p->s++; p->depth--; return v; }
  for (;;) {
    char *key = NULL;
    ws(p);
    if (obj) {
      size_t kl;
      if (p->s >= p->end || *p->s != '"' || !(key = pstring(p, &kl))) goto bad;
      ws(p);
      if (p->s >= p->end || *p->s != ':') { free(key); goto bad; }
      p->s++;
    }
    struct jval *item = pvalue(p);
    if (!item) { free(key); goto bad; }
    if (v->len == cap) {
      cap = cap ? cap * 2 : 8;
      struct jval **ni = realloc(v->items, cap * sizeof *ni);
      char **nk = obj ? realloc(v->keys, cap * sizeof *nk) : NULL;
      if (!ni || (obj && !nk)) { free(key); jfree(item); if (ni) v->items = ni; if (nk) v->keys = nk; goto bad; }
      v->items = ni;
      if (obj) v->keys = nk;
    }
    v->items[v->len] = item;
    if (obj) v->keys[v->len] = key;
    v->len++;
    ws(p);
    if (p->s >= p->end) goto bad;
    if (*p->s == ',') { p->s++; continue; }
    if (*p->s == (obj ? '}' : ']')) { p->s++; p->depth--; return v; }
    goto bad;
  }
bad:
  jfree(v);
  return NULL;
}

static struct jval *pvalue(struct parser *p) {
  ws(p);
  if (p->s >= p->end) return NULL;
  char c = *p->s;
  if (c == '{') return pcontainer(p, 1);
  if (c == '[') return pcontainer(p, 0);
  if (c == '"') {
    struct jval *v = mk(J_STR);
    if (!v) return NULL;
    if (!(v->str = pstring(p, &v->len))) { free(v); return NULL; }
    return v;
  }
  if (p->end - p->s >= 4 && !memcmp(p->s, "true", 4)) { p->s += 4; struct jval *v = mk(J_BOOL); if (v) v->boolean = 1; return v; }
  if (p->end - p->s >= 5 && !memcmp(p->s, "false", 5)) { p->s += 5; return mk(J_BOOL); }
  if (p->end - p->s >= 4 && !memcmp(p->s, "null", 4)) { p->s += 4; return mk(J_NULL); }
  if (c == '-' || (c >= '0' && c <= '9')) {
    char tmp[64];
    size_t n = 0;
    while (p->s + n < p->end && n < sizeof tmp - 1 && strchr("+-0123456789.eE", p->s[n])) n++;
    memcpy(tmp, p->s, n);
    tmp[n] = 0;
    char *e;
    double d = strtod(tmp, &e);
    if (e != tmp + n) return NULL;
    p->s += n;
    struct jval *v = mk(J_NUM);
    if (v) v->num = d;
    return v;
  }
  return NULL;
}

struct jval *jparse(const char *s, size_t n) {
  struct parser p = {s, s + n, 0};
  struct jval *v = pvalue(&p);
  if (!v) return NULL;
  ws(&p);
  if (p.s != p.end) { jfree(v); return NULL; }
  return v;
}

void jfree(struct jval *v) {
  if (!v) return;
  for (size_t i = 0; (v->type == J_ARR || v->type == J_OBJ) && i < v->len; i++) {
    jfree(v->items[i]);
    if (v->keys) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
  free(v->str);
  free(v);
}

struct jval *jget(const struct jval *o, const char *key) {
  if (!o || o->type != J_OBJ) return NULL;
  for (size_t i = 0; i < o->len; i++)
    if (!strcmp(o->keys[i], key)) return o->items[i];
  return NULL;
}

const char *jstr(const struct jval *o, const char *key) {
  struct jval *v = jget(o, key);
  return v && v->type == J_STR ? v->str : NULL;
}

double jnum(const struct jval *o, const char *key, double dflt) {
  struct jval *v = jget(o, key);
  return v && v->type == J_NUM ? v->num : dflt;
}

int jbool(const struct jval *o, const char *key, int dflt) {
  struct jval *v = jget(o, key);
  return v && v->type == J_BOOL ? v->boolean : dflt;
}

void bput(struct buf *b, const void *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t nc = b->cap ? b->cap : 256;
    while (nc < b->len + n + 1) nc *= 2;
    char *np = realloc(b->p, nc);
    if (!np) abort(); /* out of memory in the agent: nothing sensible left to do */
    b->p = np;
    b->cap = nc;
  }
  if (n) memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

void bputs(struct buf *b, const char *s) { bput(b, s, strlen(s)); }

void bprintf(struct buf *b, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < sizeof tmp) { bput(b, tmp, (size_t)n); return; }
  char *big = malloc((size_t)n + 1);
  if (!big) abort();
  va_start(ap, fmt);
  vsnprintf(big, (size_t)n + 1, fmt, ap);
  va_end(ap);
  bput(b, big, (size_t)n);
  free(big);
}

/* Length of a valid UTF-8 sequence at s (1-4), or 0 when invalid. */
static size_t utf8_len(const unsigned char *s, size_t n) {
  unsigned char c = s[0];
  size_t need;
  unsigned cp;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) { need = 2; cp = c & 0x1F; }
  else if (c >= 0xE0 && c <= 0xEF) { need = 3; cp = c & 0x0F; }
  else if (c >= 0xF0 && c <= 0xF4) { need = 4; cp = c & 0x07; }
  else return 0;
  if (n < need) return 0;
  for (size_t i = 1; i < need; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3F);
  }
  if ((need == 3 && (cp < 0x800 || (cp >= 0xD800 && cp < 0xE000))) || (need == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
    return 0;
  return need;
}

void bjstr(struct buf *b, const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  bput(b, "\"", 1);
  for (size_t i = 0; i < n;) {
    unsigned char c = u[i];
    if (c == '"' || c == '\\') { char e[2] = {'\\', (char)c}; bput(b, e, 2); i++; }
    else if (c < 0x20 || c == 0x7f) { bprintf(b, "\\u%04x", c); i++; }
    else {
      size_t l = utf8_len(u + i, n - i);
      if (!l) { bputs(b, "\\ufffd"); i++; }
      else { bput(b, u + i, l); i += l; }
    }
  }
  bput(b, "\"", 1);
}

void bfree(struct buf *b) {
  free(b->p);
  b->p = NULL;
  b->len = b->cap = 0;
}
