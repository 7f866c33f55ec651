// The exec view of a sandbox with an exec allow-list (execview.c).
#ifndef FLUXVM_PROCBOX_EXECVIEW_H
#define FLUXVM_PROCBOX_EXECVIEW_H
#include <stddef.h>
struct ev_set;
// The programs, /bin/sh, true, the helper directories of the listed programs and, with
// `closure`, everything they need mapped executable. 0, or -1 (ENOMEM).
int ev_compute(const char *const *allow, int nallow, int closure, struct ev_set **out);
int ev_count(const struct ev_set *s);
const char *ev_path(const struct ev_set *s, int i, int *dir);
void ev_free(struct ev_set *s);
// The view of `allow` (ev_compute with the closure), from the cache file `cache` when it is
// there and still valid, else computed in the caller's root and written there (tmp + rename).
// 0, or -1 with the reason in err.
int ev_prepare(const char *cache, const char *const *allow, int nallow, struct ev_set **out, char *err, size_t errsz);
// In the sandbox's mount namespace, as host root: every mount noexec, then the view's files
// and directories bound on themselves without noexec. 0, or -1 with the reason in err.
int ev_apply(const struct ev_set *s, char *err, size_t errsz);
#endif
