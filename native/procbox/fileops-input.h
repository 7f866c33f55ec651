// The parts of the fileops helper that take hostile bytes apart: request frames from the
// driver and sandbox paths with the symlinks met on the way (fileops-input.c). They live
// apart from the operations (fileops.c) so the fuzz driver (fuzz-fileops.c, `make asan`)
// links exactly them under AddressSanitizer and UndefinedBehaviorSanitizer.
#ifndef FLUXVM_PROCBOX_FILEOPS_INPUT_H
#define FLUXVM_PROCBOX_FILEOPS_INPUT_H
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#define FO_MAX_FRAME (1u << 30) // a request or answer frame, bytes
#define FO_MAX_ARGS 8           // arguments of one request
#define FO_MAX_HOPS 40          // symlinks followed by one resolution (the kernel's MAXSYMLINKS)
#define FO_MAX_COMPS 4096       // components of a path, and directories a resolution may stand in
#define FO_MAX_REOPENS 65536    // directories re-walked by name after `..` in one resolution
#define FO_MAX_VIEW 4096        // bytes of a view (the sandbox path of an anchor)

enum { OP_STAT = 1, OP_LIST, OP_READ, OP_WRITE, OP_DELETE, OP_WALK, OP_SCAN, OP_CMP, OP_RMTREE, OP_PING, OP_STATV, OP_MERGE, OP_RELEASE, OP_SYNCFS, OP_RUN, OP_SNAPSHOT };

// The message of the failing operation (fo_fail); answered to the driver with the errno.
extern char fo_msg[600];
// Sets fo_msg from the format plus ": strerror(e)" and returns -e (errno = e).
int fo_fail(int e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// openat2(dirfd, name, flags | O_CLOEXEC) with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
// RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV: one component, never a symlink, never out.
int fo_openat2(int dirfd, const char *name, int flags);

// ---- request frames ----
// A request's body (after its u32 length): u32 id | u8 op | args, each u32 len + bytes.
struct fo_args {
  const char *p[FO_MAX_ARGS]; // into the frame: not NUL-terminated
  uint32_t n[FO_MAX_ARGS];
  int count;
};
// Splits a request body of `len` bytes. 0, or -1 when malformed (short, an argument running
// past the end, more than FO_MAX_ARGS arguments): nothing of it may then be acted on.
int fo_parse_request(const char *req, uint32_t len, uint32_t *id, uint8_t *op, struct fo_args *a);
// Argument i as a u64 when it is exactly 8 bytes, else 0.
uint64_t fo_arg_u64(const struct fo_args *a, int i);
// The next item of a packed list ((u32 len, bytes)*) at *p with *left bytes: 1 and the item,
// 0 at the end, -1 when an item runs past the end.
int fo_unpack(const char **p, uint32_t *left, const char **item, uint32_t *n);

// The next record of a tar pax extended header ("LEN KEY=VALUE\n", LEN counting the whole
// record in decimal) at body[*o] of `size` bytes: 1 with the key and the value (pointers into
// body, not NUL-terminated) and *o past the record, 0 at the end, -1 when malformed.
int fo_pax_next(const char *body, size_t size, size_t *o, const char **key, size_t *kl, const char **val, size_t *vl);

// ---- paths ----
// A path split into components in place (pointers into mem, a NUL-terminated copy).
struct fo_comps {
  char *mem;
  char *c[FO_MAX_COMPS];
  int n;
};
// Splits `len` bytes of `rel` at '/'. 0, -ENOMEM, or -ENAMETOOLONG past FO_MAX_COMPS
// components; free(s->mem) in every case (NULL when the allocation failed).
int fo_split(struct fo_comps *s, const char *rel, uint32_t len);

struct fo_resolved {
  int parent;    // O_PATH fd of the directory holding the entry (-1 for the root itself)
  int fd;        // O_PATH|O_NOFOLLOW fd of the entry, -1 when it does not exist
  char name[256];
  struct stat st;
};
void fo_res_close(struct fo_resolved *r);

#define R_FOLLOW_MID 1   // follow symlinks in the middle of the path
#define R_FOLLOW_FINAL 2 // and the last component
#define R_MKDIRS 4       // make missing directories on the way (mode 0755, owned by `owner`)

// Set per request: an anchor without a view (layers, uppers) follows no symlink at all.
extern int fo_nofollow;

// Resolves `rel` (sandbox path below the root fd, `view` = the root's sandbox path for
// absolute symlink targets) into r, one openat2 per component; symlinks are followed by this
// code only (never by the kernel). 0, or -errno with fo_msg set and r closed: ELOOP past
// FO_MAX_HOPS symlinks, past FO_MAX_REOPENS re-walked directories, or a symlink where none may
// be; EXDEV a symlink or `..` leading out of the root; ENAMETOOLONG a name over 255 bytes, a
// path over FO_MAX_COMPS components or deeper than FO_MAX_COMPS directories.
int fo_resolve(int root, const char *rel, uint32_t rlen, const char *view, int flags, uid_t owner, struct fo_resolved *r);

#endif
