// procbox's CONFIG files (read_config) and what init builds from them before the sandbox's init starts:
// the workspace volume (btrfs subvolume and quota) and the overlay.
#include "procbox.h"

// Reads a CONFIG from `file`, or from the `len` bytes at `text` when text is not NULL.
int read_config_from(const char *file, const char *text, size_t len, struct config *c) {
  memset(c, 0, sizeof *c);
  FILE *f = text ? fmemopen((void *)text, len, "r") : fopen(file, "re");
  if (!f) return fail("open config %s", file);
  char *line = NULL;
  size_t cap = 0;
  ssize_t n;
  while ((n = getline(&line, &cap, f)) > 0) {
    if (line[n - 1] == '\n') line[--n] = 0;
    char *sp = strchr(line, ' ');
    if (!sp) continue;
    *sp = 0;
    char *k = line, *v = strdup(sp + 1);
    if (!v) {
      free(line), fclose(f);
      return errno = ENOMEM, fail("config %s", file);
    }
    if (!strcmp(k, "root")) c->root = v;
    else if (!strcmp(k, "etc")) c->etc = v;
    else if (!strcmp(k, "ws")) c->ws = v;
    else if (!strcmp(k, "upper")) c->upper = v;
    else if (!strcmp(k, "work")) c->work = v;
    else if (!strcmp(k, "hostname")) c->hostname = v;
    else if (!strcmp(k, "uidmap")) c->uidmap = v;
    else if (!strcmp(k, "gidmap")) c->gidmap = v;
    else if (!strcmp(k, "lower") && c->nlower < MAXLOWER) c->lower[c->nlower++] = v;
    else if (!strcmp(k, "cgroup") && c->ncgroup < MAXCG) c->cgroup[c->ncgroup++] = v;
    else if (!strcmp(k, "pool")) c->pool = atoi(v), free(v);
    else if (!strcmp(k, "vol")) c->vol = v;
    else if (!strcmp(k, "vollimit")) c->vollimit = strtoull(v, NULL, 10), free(v);
    else if (!strcmp(k, "volgroup")) c->volgroup = strtoull(v, NULL, 10), free(v);
    else if (!strcmp(k, "tmpsize")) c->tmpsize = strtoull(v, NULL, 10), free(v);
    else if (!strcmp(k, "tmpinodes")) c->tmpinodes = strtoull(v, NULL, 10), free(v);
    else if (!strcmp(k, "execlist")) c->execlist = atoi(v), free(v);
    else if (!strcmp(k, "execallow") && c->neallow < 256 && v[0]) c->eallow[c->neallow++] = v;
    else if (!strcmp(k, "viewcache")) c->viewcache = v;
    else if (!strcmp(k, "bind") && c->nbind < MAXBIND) c->bind[c->nbind++] = v;
    else if (!strcmp(k, "rows")) c->ro_ws = atoi(v), free(v);
    else if (!strcmp(k, "wpath") && c->nwpath < 64 && v[0] == '/') c->wpath[c->nwpath++] = v;
    else free(v);
  }
  free(line);
  fclose(f);
  unsigned in = 0, out = 100000, cnt = 0;
  if (c->uidmap) sscanf(c->uidmap, "%u %u %u", &in, &out, &cnt);
  c->uid = out;
  if (!c->ws || (!c->pool && (!c->upper || !c->work || c->nlower == 0))) {
    errno = 0;
    return fail("config %s: ws, upper, work and at least one lower are required", file);
  }
  return 0;
}

int read_config(const char *file, struct config *c) { return read_config_from(file, NULL, 0, c); }

// Frees what read_config_from allocated (safe on a config it failed to read: it zeroes first).
void free_config(struct config *c) {
  char *one[] = {c->root, c->etc, c->ws, c->upper, c->work, c->hostname, c->uidmap, c->gidmap, c->vol, c->viewcache};
  for (size_t i = 0; i < sizeof one / sizeof *one; i++) free(one[i]);
  for (int i = 0; i < c->nlower; i++) free(c->lower[i]);
  for (int i = 0; i < c->ncgroup; i++) free(c->cgroup[i]);
  for (int i = 0; i < c->neallow; i++) free((char *)c->eallow[i]);
  for (int i = 0; i < c->nwpath; i++) free(c->wpath[i]);
  for (int i = 0; i < c->nbind; i++) free(c->bind[i]);
  memset(c, 0, sizeof *c);
}

int ensure_vol(const struct config *c) {
  if (!c->vol) return 0;
  struct stat st;
  if (lstat(c->vol, &st) < 0) {
    if (errno != ENOENT) return fail("stat %s", c->vol);
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", c->vol);
    char *slash = strrchr(parent, '/');
    if (!slash || !slash[1]) return errno = EINVAL, fail("vol %s", c->vol);
    *slash = 0;
    int pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (pfd < 0) return fail("open %s", parent);
    struct statfs sf;
    int btrfs = fstatfs(pfd, &sf) == 0 && (unsigned long)sf.f_type == BTRFS_SUPER_MAGIC_;
    int r;
    if (btrfs && c->volgroup) {
      // Born a member of the sandbox's qgroup 1/N (no rescan needed, unlike a later assign):
      // every volume of the sandbox, also those a mark turned into layers, counts toward one limit.
      uint64_t grp = (1ULL << 48) | c->volgroup;
      struct btrfs_ioctl_qgroup_create_args ca = {.create = 1, .qgroupid = grp};
      if (ioctl(pfd, BTRFS_IOC_QGROUP_CREATE, &ca) < 0 && errno != EEXIST) return close(pfd), fail("create qgroup 1/%llu", c->volgroup);
      struct {
        struct btrfs_qgroup_inherit h;
        uint64_t q[1];
      } inh;
      memset(&inh, 0, sizeof inh);
      inh.h.num_qgroups = 1;
      inh.q[0] = grp;
      struct btrfs_ioctl_vol_args_v2 va;
      memset(&va, 0, sizeof va);
      va.flags = BTRFS_SUBVOL_QGROUP_INHERIT;
      va.size = sizeof inh;
      va.qgroup_inherit = &inh.h;
      snprintf(va.name, sizeof va.name, "%s", slash + 1);
      r = ioctl(pfd, BTRFS_IOC_SUBVOL_CREATE_V2, &va);
    } else if (btrfs) {
      struct btrfs_ioctl_vol_args va;
      memset(&va, 0, sizeof va);
      snprintf(va.name, sizeof va.name, "%s", slash + 1);
      r = ioctl(pfd, BTRFS_IOC_SUBVOL_CREATE, &va);
    } else {
      r = mkdirat(pfd, slash + 1, 0700);
    }
    close(pfd);
    if (r < 0 && errno != EEXIST) return fail("create volume %s", c->vol);
  }
  // The limit is set before the upper exists: a volume with an upper always has its limit
  // (also after a crash in between), and a remount or restart skips the ioctl.
  struct stat ust;
  int need_limit = c->vollimit && c->upper && lstat(c->upper, &ust) < 0 && errno == ENOENT;
  if (need_limit) {
    int fd = open(c->vol, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return fail("open %s", c->vol);
    struct btrfs_ioctl_qgroup_limit_args la;
    memset(&la, 0, sizeof la);
    la.qgroupid = c->volgroup ? (1ULL << 48) | c->volgroup : 0; // the sandbox's group, or the subvolume of fd
    la.lim.flags = BTRFS_QGROUP_LIMIT_MAX_RFER;
    la.lim.max_rfer = c->vollimit;
    int r = ioctl(fd, BTRFS_IOC_QGROUP_LIMIT, &la);
    close(fd);
    if (r < 0) return fail("quota limit on %s", c->vol);
  }
  if (c->upper) {
    if (mkdir(c->upper, 0755) == 0) {
      if (chown(c->upper, c->uid, c->uid) < 0) return fail("chown %s", c->upper);
    } else if (errno != EEXIST) {
      return fail("mkdir %s", c->upper);
    }
  }
  if (c->work && mkdir(c->work, 0700) < 0 && errno != EEXIST) return fail("mkdir %s", c->work);
  return 0;
}

// A btrfs snapshot of the volume `src` (a subvolume root) named `dir`/`name`: a checkpoint's
// layer freeze (O(1) in the workspace's size, no copy, no remount; checkpoint.ts). With `group`
// it is born a member of qgroup 1/group like the volume (no rescan). The ioctl flushes the
// source's dirty data and commits a btrfs transaction (superblock written after a cache flush:
// on the loop device an fsync of the image), so the snapshot is on disk when it returns.
// Host paths of the state directory (no sandbox-controlled component). -1 with errno on failure.
int snap_vol(const char *src, const char *dir, const char *name, unsigned long long group) {
  if (!*name || strchr(name, '/') || strlen(name) >= BTRFS_SUBVOL_NAME_MAX) return errno = EINVAL, -1;
  int sfd = open(src, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (sfd < 0) return -1;
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) {
    int e = errno;
    close(sfd);
    return errno = e, -1;
  }
  struct {
    struct btrfs_qgroup_inherit h;
    uint64_t q[1];
  } inh;
  memset(&inh, 0, sizeof inh);
  struct btrfs_ioctl_vol_args_v2 va;
  memset(&va, 0, sizeof va);
  va.fd = sfd;
  if (group) {
    inh.h.num_qgroups = 1;
    inh.q[0] = (1ULL << 48) | group;
    va.flags = BTRFS_SUBVOL_QGROUP_INHERIT;
    va.size = sizeof inh;
    va.qgroup_inherit = &inh.h;
  }
  snprintf(va.name, sizeof va.name, "%s", name);
  int r = ioctl(dfd, BTRFS_IOC_SNAP_CREATE_V2, &va);
  int e = errno;
  close(sfd);
  close(dfd);
  return r < 0 ? (errno = e, -1) : 0;
}

// Creates the workspace overlay as a detached mount (host mount namespace, host paths).
// redirect_dir/metacopy/index off keep every change a plain file or whiteout in the upper
// directory, which is what changesSince() reads.
int make_overlay(const struct config *c) {
  if (ensure_vol(c) < 0) return -1;
  int fs = sys_fsopen("overlay", FSOPEN_CLOEXEC);
  if (fs < 0) return fail("fsopen overlay");
  for (int i = 0; i < c->nlower; i++)
    if (sys_fsconfig(fs, PB_FSCONFIG_SET_STRING, "lowerdir+", c->lower[i], 0) < 0)
      return close(fs), fail("overlay lowerdir+ %s", c->lower[i]);
  if (sys_fsconfig(fs, PB_FSCONFIG_SET_STRING, "upperdir", c->upper, 0) < 0) return close(fs), fail("overlay upperdir");
  if (sys_fsconfig(fs, PB_FSCONFIG_SET_STRING, "workdir", c->work, 0) < 0) return close(fs), fail("overlay workdir");
  const char *off[] = {"redirect_dir", "metacopy", "index", "xino"};
  for (size_t i = 0; i < sizeof off / sizeof *off; i++)
    if (sys_fsconfig(fs, PB_FSCONFIG_SET_STRING, off[i], "off", 0) < 0) return close(fs), fail("overlay %s=off", off[i]);
  if (sys_fsconfig(fs, PB_FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0) return close(fs), fail("overlay create");
  // With an exec allow-list the workspace is noexec (execview.c): nothing written there maps executable.
  int m = sys_fsmount(fs, FSMOUNT_CLOEXEC, PB_MOUNT_ATTR_NOSUID | PB_MOUNT_ATTR_NODEV | (c->execlist ? PB_MOUNT_ATTR_NOEXEC : 0));
  close(fs);
  if (m < 0) return fail("fsmount overlay");
  return m;
}

int setns_path(pid_t pid, const char *ns, int type) {
  char p[64];
  snprintf(p, sizeof p, "/proc/%d/ns/%s", pid, ns);
  int fd = open(p, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail("open %s", p);
  int r = setns(fd, type);
  close(fd);
  if (r < 0) return fail("setns %s", ns);
  return 0;
}
