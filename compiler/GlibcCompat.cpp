// The one glibc 2.36 function that LLVM's static Support library calls:
// arc4random (llvm::sys::Process::GetRandomNumber, which seeds LLVM's hash
// functions). Defined here, hidden, it binds inside libdloss_compiler.so,
// dlossc and dloss-opt at link time instead of to glibc's, so that the
// dloss-compiler wheel built on Debian 12 (glibc 2.36) needs glibc 2.34 and
// runs on Ubuntu 22.04 (2.35) too; the wheel test prints what each binary
// needs. Same contract as glibc's: 32 random bits from the kernel, never
// failing (it aborts, as glibc's does, when the kernel gives none).
#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>

extern "C" __attribute__((visibility("hidden"))) uint32_t arc4random(void) {
  uint32_t value;
  for (;;) {
    ssize_t got = getrandom(&value, sizeof value, 0);
    if (got == static_cast<ssize_t>(sizeof value))
      return value;
    if (got < 0 && errno != EINTR)
      std::abort();
  }
}
