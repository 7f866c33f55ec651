/* fluxvm-tapfd: opens the host tap device IFNAME and runs PROGRAM with it as file
 * descriptor 3. The VM runtime (root) starts QEMU through it, so QEMU (an unprivileged user
 * under seccomp) gets exactly its own VM's link as `-netdev tap,fd=3` and never opens
 * /dev/net/tun itself: it cannot attach to another VM's tap.
 *
 *   fluxvm-tapfd IFNAME PROGRAM [ARG...]
 *
 * The tap is opened without IFF_VNET_HDR, so QEMU offers the guest no offloads: the NIC's
 * features are the same as over the backend of a VM without a network, and saved machine
 * states load across both. Exit status 111 when the tap cannot be opened. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc < 3 || strlen(argv[1]) >= IFNAMSIZ) {
    fprintf(stderr, "usage: fluxvm-tapfd IFNAME PROGRAM [ARG...]\n");
    return 111;
  }
  int fd = open("/dev/net/tun", O_RDWR);
  if (fd < 0) {
    fprintf(stderr, "fluxvm-tapfd: /dev/net/tun: %s\n", strerror(errno));
    return 111;
  }
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  snprintf(ifr.ifr_name, IFNAMSIZ, "%s", argv[1]);
  ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
  /* EBUSY: the previous QEMU of this VM (a restore, a revive) is still exiting. Its main
   * thread is a zombie already (the host saw it gone) while another of its threads still
   * holds the tap; that ends within milliseconds. Up to 5 s. */
  int rc;
  for (int i = 0; (rc = ioctl(fd, TUNSETIFF, &ifr)) && errno == EBUSY && i < 500; i++) usleep(10000);
  if (rc) {
    fprintf(stderr, "fluxvm-tapfd: tap %s: %s\n", argv[1], strerror(errno));
    return 111;
  }
  if (fd != 3) {
    if (dup2(fd, 3) < 0) {
      fprintf(stderr, "fluxvm-tapfd: dup2: %s\n", strerror(errno));
      return 111;
    }
    close(fd);
  }
  execvp(argv[2], argv + 2);
  fprintf(stderr, "fluxvm-tapfd: %s: %s\n", argv[2], strerror(errno));
  return 111;
}
