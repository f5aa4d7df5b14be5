"""The NEON backend's toolchain: an aarch64 C compiler (a cross compiler on other hosts), the
emulator that runs aarch64 code on them (qemu-user), and the small harness program that loads
a kernel there, feeds it argument files and writes its output back."""

from __future__ import annotations

import functools
import os
import platform
import shutil
from pathlib import Path

from tunecache.compiler.backends.cpu.build import CompilerInfo, build_source, probe_compiler
from tunecache.compiler.errors import BuildError, HardwareError

CC_ENV = "TUNECACHE_NEON_CC"
CROSS_COMPILER = "aarch64-linux-gnu-gcc"
EMULATOR = "qemu-aarch64"
SYSROOT = Path("/usr/aarch64-linux-gnu")
INSTALL_HINT = ("install an aarch64 cross compiler and qemu-user (Debian: apt-get install "
                "gcc-aarch64-linux-gnu qemu-user)")


def native() -> bool:
    """Whether this process runs on an aarch64 CPU (kernels then load in process)."""
    return platform.machine() in ("aarch64", "arm64")


def find_compiler() -> CompilerInfo:
    """``$TUNECACHE_NEON_CC``, else the cross compiler (the host's ``cc`` on aarch64);
    BuildError with the install hint if there is none."""
    name = os.environ.get(CC_ENV, "").strip() or ("cc" if native() else CROSS_COMPILER)
    path = shutil.which(name)
    if path is None:
        raise BuildError(f"no aarch64 C compiler found (tried {name}): {INSTALL_HINT}, or set "
                         f"{CC_ENV} to one")
    return probe_compiler(path)


def emulator() -> list[str]:
    """The command prefix that runs an aarch64 program here: empty on aarch64, else
    qemu-user with the cross toolchain's libraries; HardwareError if there is none."""
    if native():
        return []
    path = shutil.which(EMULATOR)
    if path is None or not SYSROOT.is_dir():
        raise HardwareError(f"kernels for aarch64 run on this {platform.machine()} machine only "
                            f"under emulation: {INSTALL_HINT}")
    return [path, "-L", str(SYSROOT)]


HARNESS = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
typedef int (*tc_entry)(void **);
typedef double (*tc_timer)(void **, long);

/* tc_harness LIB ITERS OUT N PATH_1 BYTES_1 ... PATH_N BYTES_N: each argument read from its
   file into a 64-byte aligned buffer; tc_kernel called once (ITERS 0) or tc_time(ITERS);
   argument OUT written back to its file; prints the seconds tc_time reported. */
int main(int argc, char **argv) {
  if (argc < 5) return 2;
  const long iters = atol(argv[2]);
  const int out = atoi(argv[3]), n = atoi(argv[4]);
  if (n < 1 || n > 16 || out < 0 || out >= n || argc != 5 + 2 * n) return 2;
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) { fprintf(stderr, "%s\n", dlerror()); return 3; }
  void *args[16];
  long bytes[16];
  for (int i = 0; i < n; i++) {
    bytes[i] = atol(argv[6 + 2 * i]);
    args[i] = aligned_alloc(64, (size_t)((bytes[i] + 127) / 64 * 64));
    FILE *f = fopen(argv[5 + 2 * i], "rb");
    if (f == NULL || args[i] == NULL ||
        fread(args[i], 1, (size_t)bytes[i], f) != (size_t)bytes[i]) {
      fprintf(stderr, "cannot read argument %d from %s\n", i, argv[5 + 2 * i]);
      return 4;
    }
    fclose(f);
  }
  double seconds = 0.0;
  if (iters > 0) {
    tc_timer timer = (tc_timer)dlsym(lib, "tc_time");
    if (timer == NULL) return 3;
    seconds = timer(args, iters);
  } else {
    tc_entry entry = (tc_entry)dlsym(lib, "tc_kernel");
    if (entry == NULL) return 3;
    if (entry(args) != 0) return 5;
  }
  FILE *f = fopen(argv[5 + 2 * out], "wb");
  if (f == NULL || fwrite(args[out], 1, (size_t)bytes[out], f) != (size_t)bytes[out]) return 4;
  fclose(f);
  printf("%.9g\n", seconds);
  return 0;
}
"""
HARNESS_FLAGS = ("-O2", "-std=gnu11")


@functools.cache
def harness() -> Path:
    """The harness program, built once per process through the build cache."""
    return build_source(HARNESS, HARNESS_FLAGS, compiler=find_compiler()).path
