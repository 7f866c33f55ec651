// What fileops.c and fileops-tar.c share (internal to the procbox helper's fileops mode).
#ifndef FLUXVM_PROCBOX_FILEOPS_IMPL_H
#define FLUXVM_PROCBOX_FILEOPS_IMPL_H
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

struct fo_args;

/** A growing output buffer (an answer frame). */
struct buf {
  char *p;
  size_t n, cap;
};

// fileops.c
int buf_put(struct buf *b, const void *d, size_t n);
static inline int put_u8(struct buf *b, uint8_t v) { return buf_put(b, &v, 1); }
static inline int put_u32(struct buf *b, uint32_t v) { return buf_put(b, &v, 4); }
static inline int put_u64(struct buf *b, uint64_t v) { return buf_put(b, &v, 8); }
static inline int put_bytes(struct buf *b, const void *d, uint32_t n) { return put_u32(b, n) || buf_put(b, d, n); }
char type_of(const struct stat *st);
int put_entry(struct buf *b, const struct stat *st, const char *name, int dfd, const char *lname);
int open_root(const char *path);
int reopen(int pathfd, int flags);
struct fo_resolved;
int open_target_dir(struct fo_resolved *r, uid_t owner, int *created);
int rm_contents(int top);
int write_full(int fd, const void *p, size_t n);
int have_openat2(void);

// fileops-walk.c
int op_walk(int root, const struct fo_args *a, struct buf *out);
int scan_fd(int d, struct buf *out);
int op_scan(int root, struct buf *out);
int op_cmp(const struct fo_args *a, struct buf *out);
int op_statv(const struct fo_args *a, struct buf *out);
int op_merge(const struct fo_args *a, struct buf *out);

// fileops-run.c
int op_run(const struct fo_args *a, struct buf *out);

// fileops-tar.c
int tar_out(int argc, char **argv);
/** Exits a tar stream with "E<errno> <fo_msg>" on stderr (returns the exit code, 1). */
int tar_fail_exit(void);
/** Decodes hex `h` into `out` (NUL-terminated, at most cap - 1 bytes); the decoded length, or -1 when malformed or too long. */
int unhex(const char *h, char *out, size_t cap);

// fileops-untar.c
int tar_in(int argc, char **argv);

// fileops-filein.c
int file_in(int argc, char **argv);
#endif
