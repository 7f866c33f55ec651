/* The session's confinement of the commands the agent starts (confine.c). */
#ifndef FLUXVM_CONFINE_H
#define FLUXVM_CONFINE_H
#include "json.h"

/* The Landlock ABI version the guest kernel offers (0: none). */
int confine_abi(void);
/* Checks the header's `confine` (absent: nothing to do): NULL when good, else why (and *code). */
const char *confine_check(struct jval *h, const char **code);
/* In the child, before exec: applies the header's `confine` (checked before the fork); on any
 * failure writes one line to stderr and _exits 126, so nothing runs unconfined. */
void confine_child(struct jval *h);
/* `@fluxvm-resolve NAME...`: what an exec allow-list resolves to here, one line each (vm.ts). */
int confine_resolve(int argc, char **argv);
#define RESOLVE_ARGV0 "@fluxvm-resolve"
#endif
