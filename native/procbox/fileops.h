// The fileops mode of the procbox helper (fileops.c): the one way the host touches sandbox files.
#ifndef FLUXVM_PROCBOX_FILEOPS_H
#define FLUXVM_PROCBOX_FILEOPS_H
int cmd_fileops(int argc, char **argv);
int cmd_scan(int argc, char **argv);
#endif
