/* A small JSON reader (into a tree) and writer (into a growing buffer) for the agent's
 * frame headers. Only what the protocol needs: objects, arrays, strings, numbers, bools. */
#ifndef FLUXVM_JSON_H
#define FLUXVM_JSON_H
#include <stddef.h>
#include <stdint.h>

enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

struct jval {
  enum jtype type;
  double num;
  int boolean;
  char *str;      /* J_STR: NUL-terminated (embedded NULs are rejected) */
  size_t len;     /* J_STR: byte length; J_ARR/J_OBJ: element count */
  char **keys;    /* J_OBJ */
  struct jval **items; /* J_ARR, J_OBJ */
};

/* Parses `n` bytes; returns NULL on malformed input. Free with jfree. */
struct jval *jparse(const char *s, size_t n);
void jfree(struct jval *v);
struct jval *jget(const struct jval *obj, const char *key);
const char *jstr(const struct jval *obj, const char *key); /* NULL unless a string */
double jnum(const struct jval *obj, const char *key, double dflt);
int jbool(const struct jval *obj, const char *key, int dflt);

struct buf {
  char *p;
  size_t len, cap;
};
void bput(struct buf *b, const void *s, size_t n);
void bputs(struct buf *b, const char *s);
void bprintf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends a JSON string literal; invalid UTF-8 bytes become U+FFFD. */
void bjstr(struct buf *b, const char *s, size_t n);
void bfree(struct buf *b);

#endif
