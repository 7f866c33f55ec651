// Build-time generator of the sandbox command's seccomp filter (confine.c apply_seccomp): the
// deny-list below, compiled to BPF by libseccomp for the build host's architecture, written to
// stdout as a C header with two programs, seccomp_bpf_plain and seccomp_bpf_exec_list (with an
// exec allow-list: memfd_create and memfd_secret denied too). The helper loads the program it
// needs with one seccomp(2) call. `make` runs this and writes build/seccomp-bpf.h.
#define _GNU_SOURCE
#include <errno.h>
#include <linux/filter.h>
#include <sched.h>
#include <seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

static int rules(scmp_filter_ctx ctx, int exec_list) {
  const char *deny[] = {"mount", "umount2", "pivot_root", "chroot", "ptrace", "process_vm_readv", "process_vm_writev",
                        "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "bpf",
                        "keyctl", "add_key", "request_key", "reboot", "setns", "unshare", "perf_event_open",
                        "swapon", "swapoff", "open_by_handle_at", "name_to_handle_at", "fsopen", "fsconfig",
                        "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr", "userfaultfd", "acct",
                        "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "syslog", "quotactl",
                        "lookup_dcookie", "iopl", "ioperm", "vhangup", "nfsservctl", "uselib", "_sysctl",
                        "personality", "fanotify_init", "io_uring_setup", "io_uring_enter", "io_uring_register"};
  int rc = 0;
  for (size_t i = 0; i < sizeof deny / sizeof *deny && !rc; i++) {
    int nr = seccomp_syscall_resolve_name(deny[i]);
    if (nr == __NR_SCMP_ERROR) continue;
    if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0) < 0) rc = -1;
  }
  // No new namespace of any kind through clone (flags are in a register, so checkable);
  // clone3 passes flags in memory, so it answers ENOSYS and libc falls back to clone.
  const uint64_t each[] = {CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWIPC, CLONE_NEWUTS, CLONE_NEWCGROUP};
  for (size_t i = 0; i < sizeof each / sizeof *each && !rc; i++)
    if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, each[i], each[i])) < 0)
      rc = -1;
  if (!rc && seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0) < 0) rc = -1;
  if (!rc && seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1, SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffff, TIOCSTI)) < 0)
    rc = -1;
  // AF_VSOCK is not network-namespaced: a sandbox of network none must not reach the
  // hypervisor or a VM's agent through it. The uevent netlink family shows the host's device
  // events (it is not namespaced for the init user namespace's devices either).
  if (!rc && seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socket), 1, SCMP_A0(SCMP_CMP_EQ, 40 /* AF_VSOCK */)) < 0)
    rc = -1;
  if (!rc && seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socketpair), 1, SCMP_A0(SCMP_CMP_EQ, 40 /* AF_VSOCK */)) < 0)
    rc = -1;
  if (!rc && seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPROTONOSUPPORT), SCMP_SYS(socket), 2, SCMP_A0(SCMP_CMP_EQ, AF_NETLINK),
                              SCMP_A2(SCMP_CMP_EQ, 15 /* NETLINK_KOBJECT_UEVENT */)) < 0)
    rc = -1;
  // With an exec allow-list: a memfd lives on an internal mount that is not noexec (and that
  // Landlock does not see), so fexecve or the loader could run an ELF written into one.
  // (vm.memfd_noexec=2 stops only the execve, not the loader's mmap(PROT_EXEC).)
  if (!rc && exec_list && seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(memfd_create), 0) < 0) rc = -1;
  if (!rc && exec_list) {
    int nr = seccomp_syscall_resolve_name("memfd_secret");
    if (nr != __NR_SCMP_ERROR && seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0) < 0) rc = -1;
  }
  return rc;
}

static int emit(const char *name, int exec_list) {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx) return fprintf(stderr, "seccomp_init failed\n"), -1;
  int rc = rules(ctx, exec_list);
  int fd = memfd_create("seccomp-bpf", MFD_CLOEXEC);
  if (!rc && fd >= 0) rc = seccomp_export_bpf(ctx, fd);
  seccomp_release(ctx);
  if (rc || fd < 0) return fprintf(stderr, "building the %s filter failed (%d)\n", name, rc), -1;
  off_t size = lseek(fd, 0, SEEK_END);
  if (size <= 0 || size % (off_t)sizeof(struct sock_filter) || size > (off_t)(BPF_MAXINSNS * sizeof(struct sock_filter)))
    return fprintf(stderr, "the %s filter has a bad size %lld\n", name, (long long)size), -1;
  struct sock_filter insn[BPF_MAXINSNS];
  if (pread(fd, insn, (size_t)size, 0) != size) return fprintf(stderr, "reading the %s filter failed\n", name), -1;
  close(fd);
  printf("static const struct sock_filter %s[] = {\n", name);
  for (off_t i = 0; i < size / (off_t)sizeof *insn; i++)
    printf("    {0x%04x, %u, %u, 0x%08x},\n", insn[i].code, insn[i].jt, insn[i].jf, insn[i].k);
  printf("};\n");
  return 0;
}

int main(void) {
  printf("// Generated by seccomp-gen.c when the helper is built: do not edit.\n#include <linux/filter.h>\n");
  if (emit("seccomp_bpf_plain", 0) < 0 || emit("seccomp_bpf_exec_list", 1) < 0) return 1;
  return fflush(stdout) == 0 ? 0 : 1;
}
